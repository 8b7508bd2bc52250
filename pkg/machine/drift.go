package machine

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// Drift reasons of Machine mode.
const (
	DriftTemplateDeleted     cloudprovider.DriftReason = "TemplateDeleted"
	DriftTemplateNotEligible cloudprovider.DriftReason = "TemplateNotEligible"
	DriftTemplateChanged     cloudprovider.DriftReason = "TemplateChanged"
	DriftBootstrapChanged    cloudprovider.DriftReason = "BootstrapChanged"
	DriftVersionChanged      cloudprovider.DriftReason = "VersionChanged"
)

// Drifted reports why a Machine made in Machine mode no longer matches
// what its NodeClass would make now, or "" when it does. Reads come from
// the hub cache; an error is returned as an error, never as drift.
func (p *Provider) Drifted(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass, m *clusterv1.Machine) (cloudprovider.DriftReason, error) {
	mt := nc.Spec.MachineTemplate
	o, err := ParseOffering(m.Annotations[v1alpha1.OfferingAnnotation])
	if mt == nil || err != nil {
		return "", nil
	}
	gvk, err := ResolveKind(p.hub, mt.InfrastructureTemplates.APIGroup, mt.InfrastructureTemplates.Kind)
	if err != nil {
		return "", nil // the NodeClass is not Ready: no replacement could launch anyway
	}
	if m.Spec.InfrastructureRef.APIGroup != gvk.Group || m.Spec.InfrastructureRef.Kind != machineKind(gvk.Kind) {
		return DriftTemplateNotEligible, nil
	}
	template := &unstructured.Unstructured{}
	template.SetGroupVersionKind(gvk)
	if err := p.hub.GetCache().Get(ctx, o.Template, template); err != nil {
		if apierrors.IsNotFound(err) {
			return DriftTemplateDeleted, nil
		}
		return "", fmt.Errorf("reading %s %s: %w", gvk.Kind, o.Template, err)
	}
	sel, err := metav1.LabelSelectorAsSelector(&mt.InfrastructureTemplates.Selector)
	if err != nil {
		return "", nil
	}
	if _, member := template.GetLabels()[v1alpha1.KarpenterMemberLabel]; !member || !sel.Matches(labels.Set(template.GetLabels())) {
		return DriftTemplateNotEligible, nil
	}
	if h := m.Annotations[v1alpha1.TemplateHashAnnotation]; h != "" && h != TemplateHash(template) {
		return DriftTemplateChanged, nil
	}
	var bootstrapTemplate *unstructured.Unstructured
	if ref := mt.Bootstrap.ConfigRef; ref != nil {
		bgvk, err := ResolveKind(p.hub, ref.APIGroup, ref.Kind)
		if err != nil {
			return "", nil
		}
		bootstrapTemplate = &unstructured.Unstructured{}
		bootstrapTemplate.SetGroupVersionKind(bgvk)
		if err := p.hub.GetCache().Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: ref.Name}, bootstrapTemplate); err != nil {
			if apierrors.IsNotFound(err) {
				return "", nil // not Ready: no replacement could launch
			}
			return "", fmt.Errorf("reading %s %s/%s: %w", ref.Kind, m.Namespace, ref.Name, err)
		}
	}
	if h := m.Annotations[v1alpha1.BootstrapHashAnnotation]; h != "" && h != BootstrapHash(mt, bootstrapTemplate) {
		return DriftBootstrapChanged, nil
	}
	want := mt.Version
	if want == "" {
		cluster := &clusterv1.Cluster{}
		if err := p.hub.GetCache().Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.ClusterName}, cluster); err != nil {
			return "", client404(err)
		}
		if want, err = clusterVersion(ctx, p, cluster); err != nil {
			return "", err
		}
	}
	if want != "" && m.Spec.Version != "" && want != m.Spec.Version {
		return DriftVersionChanged, nil
	}
	return "", nil
}

// client404 hides NotFound (nothing to compare with) and returns other errors.
func client404(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
