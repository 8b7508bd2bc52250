package machine

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/failpoint"
)

// A Machine's parts are its infrastructure machine and its bootstrap
// config. The infrastructure provider (CAPA's AWSMachine reconciler) and the
// bootstrap provider do nothing with a part until it is owned by its
// Machine (util.GetOwnerMachine) and labelled with the Cluster; Cluster
// API's Machine controller sets both (ensureExternalOwnershipAndWatch) when
// it gets to the Machine, which in a burst is a long queue. A launch makes
// the Machine first and its parts already owned and labelled as the Machine
// controller would make them, so the providers start at once and the
// Machine controller finds nothing to change (docs/design/machine-launch.md).

// parts are what a launch creates beside the Machine.
type parts struct {
	infra *unstructured.Unstructured
	// config is the bootstrap config (nil with a data Secret).
	config *unstructured.Unstructured
	// bootstrap is the Machine's spec.bootstrap.
	bootstrap clusterv1.Bootstrap
	// bootstrapTemplate is what config was made from (nil with a data Secret).
	bootstrapTemplate *unstructured.Unstructured
}

// buildParts makes (without writing anything) the parts of the Machine c
// clones, for a NodeClaim with claimLabels. A bootstrap template that cannot
// be used is a CreateError naming the NodeClass's field.
func (p *Provider) buildParts(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass, c *Clone, claimLabels map[string]string) (*parts, error) {
	infra, err := c.InfraMachine()
	if err != nil {
		return nil, err
	}
	out := &parts{infra: infra}
	mt := nc.Spec.MachineTemplate
	ref := mt.Bootstrap.ConfigRef
	if ref == nil {
		out.bootstrap = clusterv1.Bootstrap{DataSecretName: mt.Bootstrap.DataSecretName}
		return out, nil
	}
	field := fmt.Sprintf("ClusterAPINodeClass %s: spec.machineTemplate.bootstrap.configRef", nc.Name)
	gvk, err := ResolveKind(p.hub, ref.APIGroup, ref.Kind)
	if err != nil {
		return nil, cloudprovider.NewCreateError(fmt.Errorf("%s: %w", field, err), "BootstrapTemplateUnusable", err.Error())
	}
	namespace := c.Offering.Template.Namespace
	tmpl := &unstructured.Unstructured{}
	tmpl.SetGroupVersionKind(gvk)
	if err := p.hub.GetCache().Get(ctx, types.NamespacedName{Namespace: namespace, Name: ref.Name}, tmpl); err != nil {
		if apierrors.IsNotFound(err) {
			msg := fmt.Sprintf("%s: %s %s/%s does not exist", field, ref.Kind, namespace, ref.Name)
			return nil, cloudprovider.NewCreateError(errors.New(msg), "BootstrapTemplateNotFound", msg)
		}
		return nil, fmt.Errorf("reading %s %s/%s: %w", ref.Kind, namespace, ref.Name, err)
	}
	config, err := clone(tmpl, gvk, c.Name, c.ClusterName, c.Claim, c.Offering)
	if err != nil {
		return nil, err
	}
	// The kubelet registers the Node with the NodeClaim's labels.
	if _, err := addNodeLabels(config, gvk, RegistrationLabels(claimLabels, c.InstanceType, c.Offering)); err != nil {
		msg := fmt.Sprintf("%s: %s %s/%s: %v", field, ref.Kind, namespace, ref.Name, err)
		return nil, cloudprovider.NewCreateError(errors.New(msg), "BootstrapTemplateUnusable", msg)
	}
	out.config, out.bootstrapTemplate = config, tmpl
	out.bootstrap = clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{APIGroup: gvk.Group, Kind: config.GetKind(), Name: c.Name}}
	return out, nil
}

// ensureParts creates the parts the Machine m lacks, owned by it: the
// bootstrap config first (its data takes longest: the infrastructure
// provider waits for it too), then the infrastructure machine.
func (p *Provider) ensureParts(ctx context.Context, m *clusterv1.Machine, ps *parts, claim string) error {
	if ps.config != nil {
		ownedBy(ps.config, m)
		if _, err := p.ensure(ctx, ps.config, claim); err != nil {
			return err
		}
		failpoint.Crash(StepBootstrap)
	}
	ownedBy(ps.infra, m)
	if _, err := p.ensure(ctx, ps.infra, claim); err != nil {
		return err
	}
	failpoint.Crash(StepInfrastructure)
	return nil
}

// ownedBy makes obj owned by the Machine exactly as Cluster API's Machine
// controller makes it (controller reference, util.HasExactOwnerRef), with
// the Machine's Cluster label, so that it has nothing to patch.
func ownedBy(obj *unstructured.Unstructured, m *clusterv1.Machine) {
	obj.SetOwnerReferences([]metav1.OwnerReference{{
		APIVersion: clusterv1.GroupVersion.String(),
		Kind:       "Machine",
		Name:       m.Name,
		UID:        m.UID,
		Controller: ptr.To(true),
	}})
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[clusterv1.ClusterNameLabel] = m.Spec.ClusterName
	obj.SetLabels(labels)
}

// resume completes the launch of a Machine found bound to the NodeClaim: an
// earlier process may have stopped after making the Machine and before its
// parts. A Machine with a providerID, or deleting, needs nothing.
func (p *Provider) resume(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass, claim string, claimLabels map[string]string, m *clusterv1.Machine) error {
	if m.Spec.ProviderID != "" || !m.DeletionTimestamp.IsZero() || nc.Spec.MachineTemplate == nil {
		return nil
	}
	missing := false
	for _, ref := range []clusterv1.ContractVersionedObjectReference{m.Spec.InfrastructureRef, m.Spec.Bootstrap.ConfigRef} {
		if ref.Name == "" {
			continue
		}
		present, err := p.inCache(ctx, m.Namespace, ref)
		if err != nil {
			return err
		}
		missing = missing || !present
	}
	if !missing {
		return nil
	}
	c, err := p.cloneOf(ctx, nc, m)
	if err != nil {
		return err
	}
	ps, err := p.buildParts(ctx, nc, c, claimLabels)
	if err != nil {
		return err
	}
	return p.ensureParts(ctx, m, ps, claim)
}

// inCache reports whether the hub cache holds the referenced object.
func (p *Provider) inCache(ctx context.Context, namespace string, ref clusterv1.ContractVersionedObjectReference) (bool, error) {
	gvk, err := ResolveKind(p.hub, ref.APIGroup, ref.Kind)
	if err != nil {
		return false, err
	}
	if err := p.infraWatch.Ensure(ctx, gvk); err != nil {
		return false, err
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	err = p.hub.GetCache().Get(ctx, types.NamespacedName{Namespace: namespace, Name: ref.Name}, u)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading %s %s/%s: %w", ref.Kind, namespace, ref.Name, err)
	}
	return true, nil
}

// cloneOf is the Clone a Machine of this mode was made from, read back from
// what the Machine records.
func (p *Provider) cloneOf(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass, m *clusterv1.Machine) (*Clone, error) {
	o, err := ParseOffering(m.Annotations[v1alpha1.OfferingAnnotation])
	if err != nil {
		return nil, fmt.Errorf("Machine %s/%s: %w", m.Namespace, m.Name, err)
	}
	mt := nc.Spec.MachineTemplate
	gvk, err := ResolveKind(p.hub, mt.InfrastructureTemplates.APIGroup, mt.InfrastructureTemplates.Kind)
	if err != nil {
		return nil, fmt.Errorf("ClusterAPINodeClass %s: spec.machineTemplate.infrastructureTemplates: %w", nc.Name, err)
	}
	template := &unstructured.Unstructured{}
	template.SetGroupVersionKind(gvk)
	if err := p.hub.GetCache().Get(ctx, o.Template, template); err != nil {
		return nil, fmt.Errorf("reading %s %s for Machine %s/%s: %w", gvk.Kind, o.Template, m.Namespace, m.Name, err)
	}
	return &Clone{
		Template: template, ClusterName: m.Spec.ClusterName, Name: m.Name, Claim: m.Annotations[v1alpha1.NodeClaimAnnotation],
		Offering: o, InstanceType: m.Annotations[v1alpha1.InstanceTypeAnnotation], Version: m.Spec.Version,
		MachineTemplate: mt, ReservationID: m.Annotations[v1alpha1.ReservationIDAnnotation],
	}, nil
}

// machineOwner returns the Machine a part names as its owner, or nil.
func machineOwner(u client.Object) *metav1.OwnerReference {
	for _, ref := range u.GetOwnerReferences() {
		if ref.Kind == "Machine" {
			return &ref
		}
	}
	return nil
}
