package machine

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/log"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/launch"
)

// maxAttempts bounds the launches one call makes after failed ones. Each
// failed attempt leaves its offering out, so the choices run out first;
// this only guards against an offering that cannot be left out.
const maxAttempts = 8

// Mode is Machine mode behind the cloud provider's mode interface.
type Mode struct{ p *Provider }

var _ launch.Mode = Mode{}

// Mode returns the provider as a launch.Mode.
func (p *Provider) Mode() Mode { return Mode{p: p} }

// Serves reports whether the NodeClass launches standalone Machines.
func (Mode) Serves(nc *v1alpha1.ClusterAPINodeClass) bool { return nc.Spec.MachineTemplate != nil }

// InstanceTypes resolves the NodeClass's eligible templates.
func (m Mode) InstanceTypes(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass) (*instancetype.Set, error) {
	resolved, err := m.p.catalogue.Resolve(ctx, nc)
	if err != nil {
		return nil, err
	}
	return resolved.Set, nil
}

// Launch creates a standalone Machine from the cheapest offering (recorded
// on the NodeClaim as OfferingAnnotation first) and returns it once it has
// a providerID. A launch the infrastructure reports failed leaves its
// offering out and the next cheapest is launched within the same call.
func (m Mode) Launch(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass, nodeClaim *karpv1.NodeClaim, choose launch.Choose) (*launch.Launched, error) {
	if nodeClaim.Annotations == nil {
		nodeClaim.Annotations = map[string]string{}
	}
	var recorded *Offering
	if v := nodeClaim.Annotations[v1alpha1.OfferingAnnotation]; v != "" {
		// A malformed record (edited by hand) is ignored: the launch
		// resumes from what exists in the hub, or chooses again.
		if o, err := ParseOffering(v); err == nil {
			recorded = &o
		} else {
			log.FromContext(ctx).Error(err, "ignoring the recorded offering", "NodeClaim", nodeClaim.Name)
		}
	}
	record := func(o Offering) {
		nodeClaim.Annotations[v1alpha1.OfferingAnnotation] = o.String()
	}
	failed := map[string]bool{}
	var machine *clusterv1.Machine
	for attempt := 0; ; attempt++ {
		var err error
		machine, err = m.p.Launch(ctx, nc, nodeClaim.Name, nodeClaim.Labels, attempt, failed, recorded, record, func(r *Resolved) (instancetype.Source, error) {
			// Among equal prices, the first: Machines of any template are
			// created in parallel, so nothing is gained by spreading.
			srcs, err := choose(r.Set)
			if err != nil {
				return instancetype.Source{}, err
			}
			return srcs[0], nil
		})
		var fe *failedLaunchError
		if err == nil {
			break
		}
		if !errors.As(err, &fe) || attempt+1 >= maxAttempts {
			return nil, err
		}
		log.FromContext(ctx).Info("launch failed, trying the next offering", "NodeClaim", nodeClaim.Name, "Machine", fe.machine, "reason", err.Error())
		failed[fe.machine] = true
		recorded = nil
	}
	// A Machine an earlier process made (before a restart, or the leader
	// before a failover) is adopted without resolving the NodeClass, and the
	// catalogue of a fresh process knows no offering yet: Describe would then
	// return only the labels the Machine records, without kubernetes.io/os
	// and the instance labels, and Karpenter would find the NodeClaim's
	// requirements drifted and replace the node. Resolving is memoized.
	if _, err := m.p.catalogue.Resolve(ctx, nc); err != nil {
		return nil, fmt.Errorf("resolving ClusterAPINodeClass %s for NodeClaim %s: %w", nc.Name, nodeClaim.Name, err)
	}
	id, err := launch.ProviderIDOf(ctx, m.p.hub, machine)
	if err != nil {
		return nil, err
	}
	if id == "" { // gone again since the launch saw it: its infrastructure machine was removed
		return nil, fmt.Errorf("Machine %s/%s for NodeClaim %s: %w", machine.Namespace, machine.Name, nodeClaim.Name, launch.ErrStillLaunching)
	}
	out := &launch.Launched{Machine: machine, ProviderID: id, Annotations: map[string]string{v1alpha1.OfferingAnnotation: machine.Annotations[v1alpha1.OfferingAnnotation]}}
	out.Source, _ = m.Describe(machine)
	if o, err := ParseOffering(machine.Annotations[v1alpha1.OfferingAnnotation]); err == nil {
		out.From = fmt.Sprintf("%sTemplate %s", machine.Spec.InfrastructureRef.Kind, o.Template)
	}
	return out, nil
}

// Owns reports whether the Machine is a standalone Machine of this mode.
func (Mode) Owns(machine *clusterv1.Machine) bool {
	return machine.Labels[clusterv1.MachineDeploymentNameLabel] == "" && machine.Annotations[v1alpha1.OfferingAnnotation] != ""
}

// Describe returns the source of the Machine's offering; a Machine whose
// template the catalogue has not resolved (since the start) is described by
// what it says itself.
func (m Mode) Describe(machine *clusterv1.Machine) (instancetype.Source, bool) {
	o, err := ParseOffering(machine.Annotations[v1alpha1.OfferingAnnotation])
	if err != nil {
		return instancetype.Source{}, false
	}
	if src, ok := m.p.catalogue.Source(o); ok {
		return src, true
	}
	labels := map[string]string{
		corev1.LabelInstanceTypeStable: machine.Annotations[v1alpha1.InstanceTypeAnnotation],
		karpv1.CapacityTypeLabelKey:    o.CapacityType,
	}
	if o.Zone != "" {
		labels[corev1.LabelTopologyZone] = o.Zone
	}
	return instancetype.Source{Labels: labels}, true
}

// Release deletes exactly the NodeClaim's Machine.
func (m Mode) Release(ctx context.Context, claim string, machine *clusterv1.Machine) error {
	return m.p.Delete(ctx, claim, machine)
}

// Drifted reports Machine-mode drift (see Provider.Drifted).
func (m Mode) Drifted(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass, machine *clusterv1.Machine) (cloudprovider.DriftReason, error) {
	return m.p.Drifted(ctx, nc, machine)
}
