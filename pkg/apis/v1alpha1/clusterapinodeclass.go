package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ClusterAPINodeClassSpec says which Cluster API objects a NodePool launches
// nodes from. Exactly one mode is set.
// +kubebuilder:validation:XValidation:rule="has(self.scalableResourceSelector) != has(self.machineTemplate)",message="exactly one of spec.scalableResourceSelector (MachineDeployment mode) or spec.machineTemplate (Machine mode) must be set"
type ClusterAPINodeClassSpec struct {
	// ScalableResourceSelector selects the MachineDeployments this NodeClass
	// scales (MachineDeployment mode). Only MachineDeployments that also carry
	// the label node.cluster.x-k8s.io/karpenter-member are used.
	// +optional
	ScalableResourceSelector *metav1.LabelSelector `json:"scalableResourceSelector,omitempty"`

	// MachineTemplate describes standalone Machines cloned from
	// Karpenter-eligible infrastructure templates (Machine mode).
	// +optional
	MachineTemplate *MachineTemplate `json:"machineTemplate,omitempty"`

	// Kubelet is how the nodes' kubelet reserves resources and limits pods,
	// when the bootstrap template does not say (or says wrong): Karpenter
	// plans each node's allocatable with it. See KubeletConfiguration.
	// +optional
	Kubelet *KubeletConfiguration `json:"kubelet,omitempty"`
}

// MachineTemplate is the recipe for a standalone Machine in Machine mode.
type MachineTemplate struct {
	// InfrastructureTemplates picks the eligible infrastructure templates, for
	// example AWSMachineTemplates. Only templates that also carry the label
	// node.cluster.x-k8s.io/karpenter-member are used.
	InfrastructureTemplates InfrastructureTemplates `json:"infrastructureTemplates"`

	// Bootstrap says how Machines get their bootstrap data.
	Bootstrap Bootstrap `json:"bootstrap"`

	// Version is the Kubernetes version of the Machines, e.g. v1.33.1. When
	// unset, the version of the Cluster's control plane is used.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Version string `json:"version,omitempty"`

	// Metadata is added to every Machine this NodeClass creates.
	// +optional
	Metadata MachineMetadata `json:"metadata,omitempty"`
}

// InfrastructureTemplates selects infrastructure templates of one kind.
type InfrastructureTemplates struct {
	// APIGroup of the template kind, e.g. infrastructure.cluster.x-k8s.io.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	APIGroup string `json:"apiGroup"`

	// Kind of the templates, e.g. AWSMachineTemplate.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Kind string `json:"kind"`

	// Selector over the templates' labels.
	Selector metav1.LabelSelector `json:"selector"`
}

// Bootstrap gives Machines their bootstrap data: either a bootstrap config
// created from a template, or a Secret that already holds the data.
// +kubebuilder:validation:XValidation:rule="has(self.configRef) != has(self.dataSecretName)",message="exactly one of bootstrap.configRef or bootstrap.dataSecretName must be set"
type Bootstrap struct {
	// ConfigRef names a bootstrap config template, e.g. a KubeadmConfigTemplate.
	// +optional
	ConfigRef *TemplateReference `json:"configRef,omitempty"`

	// DataSecretName is the name of a Secret in the Cluster's namespace that
	// holds the bootstrap data under the key "value".
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	DataSecretName *string `json:"dataSecretName,omitempty"`
}

// TemplateReference names an object in the Cluster's namespace; its version
// is resolved the Cluster API way (the CRD's contract labels).
type TemplateReference struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	APIGroup string `json:"apiGroup"`
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Kind string `json:"kind"`
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// MachineMetadata is added to Machines.
type MachineMetadata struct {
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ClusterAPINodeClass is the Karpenter NodeClass for Cluster API.
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=clusterapinodeclasses,scope=Cluster,categories=karpenter,shortName={capinc,capincs}
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Ready",type="string",JSONPath=".status.conditions[?(@.type==\"Ready\")].status"
// +kubebuilder:printcolumn:name="Instance Types",type="integer",JSONPath=".status.instanceTypeCount"
// +kubebuilder:printcolumn:name="Reason",type="string",JSONPath=".status.conditions[?(@.type==\"InstanceTypesResolved\")].reason"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="Templates",type="string",JSONPath=".spec.machineTemplate.infrastructureTemplates.kind",priority=1
// +kubebuilder:printcolumn:name="Prices",type="string",JSONPath=".status.conditions[?(@.type==\"PricesConfigured\")].reason",priority=1
// +kubebuilder:printcolumn:name="Message",type="string",JSONPath=".status.conditions[?(@.type==\"InstanceTypesResolved\")].message",priority=1
type ClusterAPINodeClass struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ClusterAPINodeClassSpec   `json:"spec,omitempty"`
	Status ClusterAPINodeClassStatus `json:"status,omitempty"`
}

// ClusterAPINodeClassList is a list of ClusterAPINodeClasses.
// +kubebuilder:object:root=true
type ClusterAPINodeClassList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterAPINodeClass `json:"items"`
}
