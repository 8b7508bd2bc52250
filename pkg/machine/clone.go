package machine

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

// Clone is what one launch of Machine mode copies for a NodeClaim from the
// offering chosen for it: the offering's infrastructure template, the
// Cluster the Machine joins and the Machine's Kubernetes version. Its
// methods build the infrastructure machine and the Machine exactly as a
// launch creates them (Provider.create); the side-by-side bench's Cluster
// API floor (test/e2e) builds its Machines here too, so that they are the
// Machines this mode makes, without Karpenter.
type Clone struct {
	// Template is the offering's infrastructure template, its kind set to
	// the version-resolved kind of the NodeClass's infrastructureTemplates.
	Template *unstructured.Unstructured
	// ClusterName is the Cluster the Machine joins.
	ClusterName string
	// Name of the infrastructure machine, the bootstrap config and the Machine.
	Name string
	// Claim is the NodeClaim the launch is for.
	Claim    string
	Offering Offering
	// InstanceType is the instance type the offering launches.
	InstanceType string
	// Version is the Machine's Kubernetes version: the NodeClass's, else the
	// version the Cluster's control plane runs (see clusterVersion).
	Version         string
	MachineTemplate *v1alpha1.MachineTemplate
	// ReservationID is the capacity reservation a reserved launch takes a
	// slot of ("" otherwise).
	ReservationID string
}

// NewClone reads what a launch of claim (its attempt-th, 0 first) copies
// from src, an offering of the NodeClass resolved to templateKind: the
// offering's template and Cluster from the hub cache, and the version new
// Machines get.
func NewClone(ctx context.Context, h *hub.Hub, nc *v1alpha1.ClusterAPINodeClass, templateKind schema.GroupVersionKind, src instancetype.Source, offering Offering, claim string, attempt int) (*Clone, error) {
	mt := nc.Spec.MachineTemplate
	if mt == nil {
		return nil, fmt.Errorf("ClusterAPINodeClass %s has no spec.machineTemplate", nc.Name)
	}
	template := &unstructured.Unstructured{}
	template.SetGroupVersionKind(templateKind)
	if err := h.GetCache().Get(ctx, offering.Template, template); err != nil {
		return nil, fmt.Errorf("reading %s %s chosen for NodeClaim %s: %w", templateKind.Kind, offering.Template, claim, err)
	}
	cluster := &clusterv1.Cluster{}
	if err := h.GetCache().Get(ctx, types.NamespacedName{Namespace: offering.Template.Namespace, Name: src.ClusterName}, cluster); err != nil {
		return nil, fmt.Errorf("reading Cluster %s/%s for NodeClaim %s: %w", offering.Template.Namespace, src.ClusterName, claim, err)
	}
	version := mt.Version
	if version == "" {
		var err error
		if version, err = runningVersion(ctx, h, cluster); err != nil {
			return nil, err
		}
	}
	return &Clone{
		Template: template, ClusterName: cluster.Name, Name: attemptName(cluster.Name, claim, attempt),
		Claim: claim, Offering: offering, InstanceType: src.Name, Version: version, MachineTemplate: mt,
	}, nil
}

// InfraMachine is the infrastructure machine: the template's spec.template
// cloned as a MachineSet clones it, a CAPA AWSMachine made a plain
// on-demand or spot request unless the offering is the reserved one.
func (c *Clone) InfraMachine() (*unstructured.Unstructured, error) {
	gvk := c.Template.GroupVersionKind()
	infra, err := clone(c.Template, gvk, c.Name, c.ClusterName, c.Claim, c.Offering)
	if err != nil {
		return nil, err
	}
	if c.Offering.CapacityType != karpv1.CapacityTypeReserved && spotCapable(gvk) {
		// The template's reservation is for the reserved offering only.
		dropReservation(infra)
	}
	if c.Offering.CapacityType == karpv1.CapacityTypeSpot && spotCapable(gvk) {
		if err := makeSpot(infra); err != nil {
			return nil, fmt.Errorf("making %s %s/%s spot: %w", infra.GetKind(), infra.GetNamespace(), c.Name, err)
		}
	}
	return infra, nil
}

// Machine is the Machine referencing the infrastructure machine and the
// bootstrap (a bootstrap config made from bootstrapTemplate, or the
// NodeClass's data Secret with bootstrapTemplate nil).
func (c *Clone) Machine(bootstrap clusterv1.Bootstrap, bootstrapTemplate *unstructured.Unstructured) *clusterv1.Machine {
	gvk := c.Template.GroupVersionKind()
	return newMachine(machineSpec{
		name: c.Name, clusterName: c.ClusterName, claim: c.Claim, version: c.Version, instanceType: c.InstanceType,
		offering:      c.Offering,
		reservationID: c.ReservationID,
		infra:         clusterv1.ContractVersionedObjectReference{APIGroup: gvk.Group, Kind: machineKind(gvk.Kind), Name: c.Name},
		bootstrap:     bootstrap,
		metadata:      c.MachineTemplate.Metadata,
		templateHash:  TemplateHash(c.Template),
		bootstrapHash: BootstrapHash(c.MachineTemplate, bootstrapTemplate),
	})
}
