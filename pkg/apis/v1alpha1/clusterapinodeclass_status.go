package v1alpha1

import (
	"github.com/awslabs/operatorpkg/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types of a ClusterAPINodeClass.
const (
	// ConditionTypeInstanceTypesResolved is True when the NodeClass's selection
	// resolves to at least one usable MachineDeployment or template in scope.
	ConditionTypeInstanceTypesResolved = "InstanceTypesResolved"
	// ConditionTypePricesConfigured is True when every offering has a price
	// from an annotation, False when some are priced by estimate. It does not
	// affect readiness: estimated prices work, real ones work better.
	ConditionTypePricesConfigured = "PricesConfigured"
	// ConditionTypeTopologyReplicas (MachineDeployment mode) is False when a
	// selected MachineDeployment belongs to a Cluster topology whose worker
	// sets replicas: the topology controller sets back what Karpenter
	// changes. It does not affect readiness (the other MachineDeployments
	// still work); the message names each Cluster and worker.
	ConditionTypeTopologyReplicas = "TopologyReplicas"
)

// ClusterAPINodeClassStatus is what the provider resolved from the spec.
type ClusterAPINodeClassStatus struct {
	// Conditions: Ready, and what it depends on.
	// +optional
	Conditions []status.Condition `json:"conditions,omitempty"`

	// InstanceTypeCount is how many instance types the NodeClass resolves to.
	// +optional
	InstanceTypeCount int32 `json:"instanceTypeCount,omitempty"`

	// InstanceTypes lists the instance types the NodeClass resolves to.
	// +optional
	// +listType=atomic
	InstanceTypes []string `json:"instanceTypes,omitempty"`

	// EstimatedPrices lists the instance types with an offering priced by
	// the resource-based estimate because no price annotation gave a price.
	// +optional
	// +listType=atomic
	EstimatedPrices []string `json:"estimatedPrices,omitempty"`

	// DriftHash changes whenever what new nodes are made from changes (in
	// Machine mode: the eligible templates' specs and the bootstrap settings
	// and template). Karpenter re-checks the NodeClass's nodes for drift
	// when it changes.
	// +optional
	DriftHash string `json:"driftHash,omitempty"`

	// UnavailableOfferings are the NodeClass's offerings left out of
	// launches after they reported insufficient capacity (Machine mode),
	// until the time given.
	// +optional
	// +listType=atomic
	UnavailableOfferings []UnavailableOffering `json:"unavailableOfferings,omitempty"`
}

// UnavailableOffering is an offering left out of launches for a while.
type UnavailableOffering struct {
	InstanceType string `json:"instanceType"`
	// +optional
	Zone         string `json:"zone,omitempty"`
	CapacityType string `json:"capacityType"`
	// Until is when the offering is tried again.
	Until metav1.Time `json:"until"`
	// Reason is what the launch reported.
	// +optional
	Reason string `json:"reason,omitempty"`
}

// StatusConditions returns the condition set; Ready follows its dependents.
func (in *ClusterAPINodeClass) StatusConditions(opts ...status.ForOption) status.ConditionSet {
	return status.NewReadyConditions(ConditionTypeInstanceTypesResolved).For(in, opts...)
}

// GetConditions implements status.Object.
func (in *ClusterAPINodeClass) GetConditions() []status.Condition {
	return in.Status.Conditions
}

// SetConditions implements status.Object.
func (in *ClusterAPINodeClass) SetConditions(conditions []status.Condition) {
	in.Status.Conditions = conditions
}
