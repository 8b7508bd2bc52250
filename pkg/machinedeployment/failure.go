package machinedeployment

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

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

// whyFailedLaunch ends the sentence "NodeClaim <claim> …" of a release
// for a failed launch.
const whyFailedLaunch = "failed to launch"

// fail gives up on the launch of the Machine bound to claim, which its
// infrastructure machine reports failed: the offering (instance type, zone,
// capacity type) is left out for the unavailable-offerings TTL, and exactly
// this Machine is released (marked, its replica lowered), so that the
// MachineDeployment keeps no failed replica. Marking takes the Machine
// from the claim (BoundMachine skips marked ones): the next choice raises.
func (p *Provider) fail(ctx context.Context, claim string, m *clusterv1.Machine, f launch.LaunchFailure) error {
	// Only a live read decides: a cache that lags may still show a Machine
	// an earlier call (maybe of a process before a restart) released, and
	// failing it again would choose afresh and raise a second replica for
	// the claim while the first call's raise stands.
	live := &clusterv1.Machine{}
	if err := p.hub.GetAPIReader().Get(ctx, client.ObjectKeyFromObject(m), live); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading Machine %s/%s whose launch failed: %w", m.Namespace, m.Name, err)
	} else if err != nil || !p.boundTo(live, claim) || live.UID != m.UID {
		return fmt.Errorf("NodeClaim %s: the failed launch of Machine %s/%s was handled already, the cache lags: %w", claim, m.Namespace, m.Name, ErrStillLaunching)
	}
	m = live
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
	if err := p.release(ctx, claim, m, whyFailedLaunch); err != nil {
		return fmt.Errorf("releasing Machine %s/%s whose launch failed: %w", m.Namespace, m.Name, err)
	}
	if p.Events != nil {
		p.Events.Eventf(m, corev1.EventTypeWarning, "LaunchFailed", "Launch for NodeClaim %s failed, Machine released and its offering left out: %s", claim, f.Message)
	}
	return &launchFailedError{machine: m.Namespace + "/" + m.Name, err: cloudprovider.NewInsufficientCapacityError(
		fmt.Errorf("NodeClaim %s: launch of Machine %s/%s of MachineDeployment %s failed: %s", claim, m.Namespace, m.Name, origin, f.Message))}
}
