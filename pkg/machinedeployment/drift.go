package machinedeployment

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinedeployment/mdutil"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
)

// Drift reasons of MachineDeployment mode.
const (
	// DriftMachineSetOutdated: the Machine belongs to a MachineSet whose
	// template is not the MachineDeployment's current one (a changed
	// infrastructure template, bootstrap, version or failure domain), as
	// Cluster API's own rollout decides it.
	DriftMachineSetOutdated cloudprovider.DriftReason = "MachineSetOutdated"
	// DriftMachineDeploymentNotEligible: the MachineDeployment lost the
	// member label or no longer matches the NodeClass's selector.
	DriftMachineDeploymentNotEligible cloudprovider.DriftReason = "MachineDeploymentNotEligible"
)

// Drifted reports why a Machine of MachineDeployment mode no longer matches
// what its NodeClass would launch now, or "" when it does. Reads come from
// the hub cache; an error is returned as an error, never as drift.
func (p *Provider) Drifted(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass, m *clusterv1.Machine) (cloudprovider.DriftReason, error) {
	name := m.Labels[clusterv1.MachineDeploymentNameLabel]
	if name == "" || nc.Spec.ScalableResourceSelector == nil {
		return "", nil
	}
	md := &clusterv1.MachineDeployment{}
	if err := p.hub.GetCache().Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: name}, md); err != nil {
		// A deleted MachineDeployment takes its Machines with it.
		return "", client404(err)
	}
	sel, err := metav1.LabelSelectorAsSelector(nc.Spec.ScalableResourceSelector)
	if err != nil {
		return "", nil // the NodeClass is not Ready: no replacement could launch
	}
	if _, member := md.Labels[v1alpha1.KarpenterMemberLabel]; !member || !sel.Matches(labels.Set(md.Labels)) || !p.hub.Scope.Contains(md, md.Spec.ClusterName) {
		return DriftMachineDeploymentNotEligible, nil
	}
	msName := machineSetOf(m)
	if msName == "" {
		return "", nil
	}
	ms := &clusterv1.MachineSet{}
	if err := p.hub.GetCache().Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: msName}, ms); err != nil {
		return "", client404(err)
	}
	if upToDate, _ := mdutil.MachineTemplateUpToDate(&ms.Spec.Template, &md.Spec.Template); !upToDate {
		return DriftMachineSetOutdated, nil
	}
	return "", nil
}

// newestOf returns the MachineSet whose template matches the
// MachineDeployment's (the newest such when several do), or nil.
func newestOf(md *clusterv1.MachineDeployment, sets []clusterv1.MachineSet) *clusterv1.MachineSet {
	var newest *clusterv1.MachineSet
	for i := range sets {
		ms := &sets[i]
		if !ms.DeletionTimestamp.IsZero() || !metav1.IsControlledBy(ms, md) {
			continue
		}
		if upToDate, _ := mdutil.MachineTemplateUpToDate(&ms.Spec.Template, &md.Spec.Template); !upToDate {
			continue
		}
		if newest == nil || newest.CreationTimestamp.Before(&ms.CreationTimestamp) {
			newest = ms
		}
	}
	return newest
}

// rolloutKey is what of a MachineDeployment decides whether its Machines
// are up to date: the fields Cluster API rolls out on, and membership
// (whether the NodeClass's selector matches shows in DriftHash's keys).
func rolloutKey(md *clusterv1.MachineDeployment) string {
	t := mdutil.MachineTemplateDeepCopyRolloutFields(&md.Spec.Template)
	_, member := md.Labels[v1alpha1.KarpenterMemberLabel]
	data, _ := json.Marshal(struct {
		Version       string
		Bootstrap     clusterv1.Bootstrap
		Infra         clusterv1.ContractVersionedObjectReference
		FailureDomain string
		Member        bool
	}{t.Spec.Version, t.Spec.Bootstrap, t.Spec.InfrastructureRef, t.Spec.FailureDomain, member})
	return string(data)
}

// DriftHash hashes the rollout fields of the member MachineDeployments in
// scope that sel selects. It goes into the NodeClass's status.driftHash, so
// that a change (a new infrastructure template, a version) updates the
// NodeClass and Karpenter re-checks drift at once, not at its next periodic
// check.
func DriftHash(ctx context.Context, h *hub.Hub, sel labels.Selector) (string, error) {
	list := &clusterv1.MachineDeploymentList{}
	if err := h.GetCache().List(ctx, list, h.Scope.ListOptions(hub.HasLabel(labels.Everything(), v1alpha1.KarpenterMemberLabel))...); err != nil {
		return "", fmt.Errorf("listing MachineDeployments: %w", err)
	}
	var keys []string
	for i := range list.Items {
		md := &list.Items[i]
		if !sel.Matches(labels.Set(md.Labels)) || !h.Scope.Contains(md, md.Spec.ClusterName) {
			continue
		}
		keys = append(keys, md.Namespace+"/"+md.Name+"="+rolloutKey(md))
	}
	if len(keys) == 0 {
		return "", nil
	}
	sort.Strings(keys)
	sum := sha256.New()
	for _, k := range keys {
		sum.Write([]byte(k))
		sum.Write([]byte{0})
	}
	return hex.EncodeToString(sum.Sum(nil))[:16], nil
}

// client404 hides NotFound (nothing to compare with) and returns other errors.
func client404(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// machineSetOf is the name of the MachineSet that controls the Machine.
func machineSetOf(m *clusterv1.Machine) string {
	for _, ref := range m.OwnerReferences {
		if ref.Kind == "MachineSet" && ref.Controller != nil && *ref.Controller {
			return ref.Name
		}
	}
	return ""
}
