package machinedeployment

import (
	"context"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/kubelet"
	"github.com/autonode/karpenter-clusterapi/pkg/launch"
)

// Mode is MachineDeployment mode behind the cloud provider's mode interface.
type Mode struct{ p *Provider }

var _ launch.Mode = Mode{}

// Mode returns the provider as a launch.Mode.
func (p *Provider) Mode() Mode { return Mode{p: p} }

// Serves reports whether the NodeClass selects MachineDeployments.
func (Mode) Serves(nc *v1alpha1.ClusterAPINodeClass) bool {
	return nc.Spec.ScalableResourceSelector != nil && nc.Spec.MachineTemplate == nil
}

// InstanceTypes resolves the selected member MachineDeployments, with the
// NodeClass's kubelet settings and offerings a failed launch left out
// marked unavailable.
func (m Mode) InstanceTypes(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass) (*instancetype.Set, error) {
	if err := m.p.store.Prime(ctx); err != nil {
		return nil, err
	}
	sel, err := metav1.LabelSelectorAsSelector(nc.Spec.ScalableResourceSelector)
	if err != nil {
		return nil, fmt.Errorf("ClusterAPINodeClass %s: spec.scalableResourceSelector: %w", nc.Name, err)
	}
	// Bad spec.kubelet values fall back; the NodeClass status reports them.
	kubeletConfig, _ := kubelet.FromNodeClass(nc.Spec.Kubelet)
	return m.p.WithUnavailable(m.p.store.ResolveKubelet(sel, kubeletConfig, sel.String())), nil
}

// Launch raises a replica of the cheapest MachineDeployment for the
// NodeClaim (recorded on it as MachineDeploymentAnnotation first) and
// returns the Machine bound to it once it has a providerID.
func (m Mode) Launch(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass, nodeClaim *karpv1.NodeClaim, choose launch.Choose) (*launch.Launched, error) {
	if nodeClaim.Annotations == nil {
		nodeClaim.Annotations = map[string]string{}
	}
	var earlier *types.NamespacedName
	if ref := nodeClaim.Annotations[v1alpha1.MachineDeploymentAnnotation]; ref != "" {
		ns, name, ok := strings.Cut(ref, "/")
		if !ok || ns == "" || name == "" {
			return nil, fmt.Errorf("NodeClaim %s: annotation %s %q is not <namespace>/<name>", nodeClaim.Name, v1alpha1.MachineDeploymentAnnotation, ref)
		}
		earlier = &types.NamespacedName{Namespace: ns, Name: name}
	}
	record := func(md types.NamespacedName) {
		nodeClaim.Annotations[v1alpha1.MachineDeploymentAnnotation] = md.String()
	}
	var set *instancetype.Set
	machine, err := m.p.Launch(ctx, nodeClaim.Name, earlier, record, func(avoid *types.NamespacedName) (instancetype.Source, error) {
		// Resolved at each choice: a failed launch marks its offering
		// unavailable before the next.
		var err error
		if set, err = m.InstanceTypes(ctx, nc); err != nil {
			return instancetype.Source{}, err
		}
		srcs, err := choose(set)
		if err != nil {
			return instancetype.Source{}, err
		}
		if avoid != nil {
			if srcs = without(srcs, *avoid); len(srcs) == 0 {
				return instancetype.Source{}, fmt.Errorf("NodeClaim %s: no member MachineDeployment of the offering but %s", nodeClaim.Name, avoid)
			}
		}
		return m.p.spread(ctx, nodeClaim.Name, srcs), nil
	})
	if err != nil {
		return nil, err
	}
	if set == nil {
		if set, err = m.InstanceTypes(ctx, nc); err != nil {
			return nil, err
		}
	}
	id, err := launch.ProviderIDOf(ctx, m.p.hub, machine)
	if err != nil {
		return nil, err
	}
	if id == "" { // gone again since the launch saw it: its infrastructure machine was removed
		return nil, fmt.Errorf("Machine %s/%s for NodeClaim %s: %w", machine.Namespace, machine.Name, nodeClaim.Name, launch.ErrStillLaunching)
	}
	// The bind's MachineBound event named the Machine and its
	// MachineDeployment on the NodeClaim: no Launched event says it again.
	out := &launch.Launched{Machine: machine, ProviderID: id, Annotations: map[string]string{}, Announced: true,
		From: fmt.Sprintf("MachineDeployment %s/%s", machine.Namespace, machine.Labels[clusterv1.MachineDeploymentNameLabel])}
	if v := nodeClaim.Annotations[v1alpha1.MachineDeploymentAnnotation]; v != "" {
		out.Annotations[v1alpha1.MachineDeploymentAnnotation] = v
	}
	origin := types.NamespacedName{Namespace: machine.Namespace, Name: machine.Labels[clusterv1.MachineDeploymentNameLabel]}
	// The set carries the NodeClass's spec.kubelet, the store does not:
	// promise the capacity and allocatable Karpenter planned with.
	if src, ok := set.Source(origin); ok {
		out.Source = src
	} else if src, ok := m.Describe(machine); ok {
		out.Source = src
	}
	return out, nil
}

// Owns reports whether the Machine belongs to a MachineDeployment.
func (Mode) Owns(machine *clusterv1.Machine) bool {
	return machine.Labels[clusterv1.MachineDeploymentNameLabel] != ""
}

// Describe returns the source of the Machine's MachineDeployment.
func (m Mode) Describe(machine *clusterv1.Machine) (instancetype.Source, bool) {
	md := machine.Labels[clusterv1.MachineDeploymentNameLabel]
	if md == "" {
		return instancetype.Source{}, false
	}
	src, ok := m.p.store.Get(types.NamespacedName{Namespace: machine.Namespace, Name: md})
	return src, ok && src.Err == nil
}

// Release marks the NodeClaim's Machine and gives its replica back (or,
// without a Machine, a replica raised for the claim).
func (m Mode) Release(ctx context.Context, claim string, machine *clusterv1.Machine) error {
	return m.p.Release(ctx, claim, machine)
}

// Drifted reports MachineDeployment-mode drift (see Provider.Drifted).
func (m Mode) Drifted(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass, machine *clusterv1.Machine) (cloudprovider.DriftReason, error) {
	return m.p.Drifted(ctx, nc, machine)
}

// without returns srcs without the MachineDeployment md.
func without(srcs []instancetype.Source, md types.NamespacedName) []instancetype.Source {
	out := make([]instancetype.Source, 0, len(srcs))
	for _, s := range srcs {
		if s.Origin != md {
			out = append(out, s)
		}
	}
	return out
}
