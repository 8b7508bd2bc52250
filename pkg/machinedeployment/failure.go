package machinedeployment

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/launch"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
)

// launchFailedError is a launch the infrastructure reported failed; it
// unwraps to Karpenter's InsufficientCapacityError.
type launchFailedError struct {
	err     error
	machine string // "<ns>/<name>" of the Machine that failed
}

func (e *launchFailedError) Error() string { return e.err.Error() }
func (e *launchFailedError) Unwrap() error { return e.err }

// fail gives up on the launch of the Machine bound to claim, which its
// infrastructure machine reports failed: the offering (instance type, zone,
// capacity type) is left out for the unavailable-offerings TTL, and exactly
// this Machine is released (marked, its replica given back), so that the
// MachineDeployment does not keep a failed replica.
func (p *Provider) fail(ctx context.Context, claim string, m *clusterv1.Machine, f launch.LaunchFailure) error {
	if handled, err := p.failureHandled(ctx, claim, m); err != nil {
		return err
	} else if handled {
		// An earlier call released this Machine already (maybe a process
		// before a restart, which remembers nothing): the claim was raised
		// for again then, maybe on another MachineDeployment the cache
		// does not show yet. Failing it again would choose afresh and
		// raise a second replica for the claim (model seed 33: bound on two
		// MachineDeployments). Core retries once the cache shows the mark.
		return fmt.Errorf("NodeClaim %s: the failed launch of Machine %s/%s was handled already, the cache lags: %w", claim, m.Namespace, m.Name, ErrStillLaunching)
	}
	kind := "failed"
	if f.InsufficientCapacity {
		kind = "insufficient_capacity"
	}
	metrics.MachineLaunchFailures.WithLabelValues(kind).Inc()
	origin := types.NamespacedName{Namespace: m.Namespace, Name: m.Labels[clusterv1.MachineDeploymentNameLabel]}
	if src, ok := p.store.Get(origin); ok && src.Err == nil && p.unavailable != nil {
		zone := m.Spec.FailureDomain
		if zone == "" {
			zone = src.Zone
		}
		p.unavailable.Mark(instancetype.OfferingKey{InstanceType: src.Name, Zone: zone, CapacityType: src.CapacityType}, f.Message)
	}
	// The claim is raised for again (next offering): forget that this
	// Machine was its, and drop its reservation here if the cache has not
	// shown the binding yet, without changing a count.
	p.recent.forget(claim)
	p.inflight.Delete(claim)
	if err := p.scaler.Apply(ctx, origin, &op{kind: opBound, name: claim}); err != nil {
		return err
	}
	if err := p.Release(ctx, claim, m); err != nil && !errors.Is(err, ErrMachineGone) {
		return fmt.Errorf("releasing Machine %s/%s whose launch failed: %w", m.Namespace, m.Name, err)
	}
	if p.Events != nil {
		p.Events.Eventf(m, corev1.EventTypeWarning, "LaunchFailed", "Launch for NodeClaim %s failed, Machine released and its offering left out: %s", claim, f.Message)
	}
	return &launchFailedError{machine: m.Namespace + "/" + m.Name, err: cloudprovider.NewInsufficientCapacityError(
		fmt.Errorf("NodeClaim %s: launch of Machine %s/%s of MachineDeployment %s failed: %s", claim, m.Namespace, m.Name, origin, f.Message))}
}

// recentlyBound returns the Machine this process bound to claim lately and
// that the cache may not show yet, read live; nil when there is none or it
// is gone.
func (p *Provider) recentlyBound(ctx context.Context, claim string) (*clusterv1.Machine, error) {
	machine, ok := p.recent.claimMachine(claim, p.now())
	if !ok {
		return nil, nil
	}
	ns, name, _ := strings.Cut(machine, "/")
	m := &clusterv1.Machine{}
	if err := p.hub.GetAPIReader().Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, m); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading Machine %s bound to NodeClaim %s: %w", machine, claim, err)
	}
	return m, nil
}

// keptAtMinSize reports whether a released Machine's replica was kept
// because the MachineDeployment is at its min size: the op says so, or a
// retry finds the Machine released already, not being deleted, and the
// replicas at or below the minimum.
func (p *Provider) keptAtMinSize(ctx context.Context, key types.NamespacedName, m *clusterv1.Machine, release *op) (bool, error) {
	if release.kept {
		return true, nil
	}
	md := &clusterv1.MachineDeployment{}
	if err := p.hub.GetAPIReader().Get(ctx, key, md); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	minSize, hasMin, _ := sizeBound(md, instancetype.MinSizeAnnotation)
	if !hasMin || md.Spec.Replicas == nil || *md.Spec.Replicas > minSize {
		return false, nil
	}
	// At the minimum, the MachineSet removes a marked Machine only when
	// it has more Machines than replicas.
	machines := &clusterv1.MachineList{}
	if err := p.hub.GetCache().List(ctx, machines, client.InNamespace(md.Namespace),
		client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
		return false, err
	}
	live := int32(0)
	for i := range machines.Items {
		if machines.Items[i].DeletionTimestamp.IsZero() {
			live++
		}
	}
	return live <= *md.Spec.Replicas, nil
}

// deleteMachine deletes exactly this Machine (UID precondition).
func (p *Provider) deleteMachine(ctx context.Context, m *clusterv1.Machine) error {
	err := p.hub.GetClient().Delete(ctx, m, client.Preconditions{UID: &m.UID})
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return ErrMachineGone
	default:
		return fmt.Errorf("deleting Machine %s/%s: %w", m.Namespace, m.Name, err)
	}
}

// failureHandled reports whether the Machine whose launch failed is, by a
// live read, released already (marked or being deleted), gone, or no longer
// bound to claim: the cache showed it bound and unmarked because it lags.
func (p *Provider) failureHandled(ctx context.Context, claim string, m *clusterv1.Machine) (bool, error) {
	live := &clusterv1.Machine{}
	err := p.hub.GetAPIReader().Get(ctx, client.ObjectKeyFromObject(m), live)
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("reading Machine %s/%s whose launch failed: %w", m.Namespace, m.Name, err)
	}
	_, marked := live.Annotations[clusterv1.DeleteMachineAnnotation]
	return marked || live.UID != m.UID || !live.DeletionTimestamp.IsZero() || live.Annotations[v1alpha1.NodeClaimAnnotation] != claim, nil
}
