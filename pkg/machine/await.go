package machine

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/launch"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
)

// await waits for the providerID of the Machine's instance (ProviderIDOf:
// the infrastructure machine's, before the Machine's own). A launch that
// failed (the infrastructure machine reports it, or no providerID arrives
// within LaunchTimeout while its offering stalls, see progress) makes its
// offering unavailable, removes the Machine and returns an insufficient
// capacity error, so that Karpenter relaunches elsewhere. A launch past the
// timeout that waits in the infrastructure's queue behind others goes on
// waiting (docs/design/machine-launch.md).
func (p *Provider) await(ctx context.Context, claim string, m *clusterv1.Machine) (*clusterv1.Machine, error) {
	timer := time.NewTimer(p.LaunchWait)
	defer timer.Stop()
	defer p.progress.await(claim)()
	key := client.ObjectKeyFromObject(m)
	var wokeAt time.Time
	queuedLogged := false
	delivered := func(m *clusterv1.Machine) {
		p.progress.deliver(offeringKeyOf(m), m.CreationTimestamp.Time, p.now())
		if !wokeAt.IsZero() {
			metrics.LaunchReturnDelay.Observe(time.Since(wokeAt).Seconds())
		}
	}
	for {
		ch := p.waiters.Register(claim)
		current := &clusterv1.Machine{}
		err := p.hub.GetCache().Get(ctx, key, current)
		switch {
		case err == nil:
			m = current
		case apierrors.IsNotFound(err):
			// Just created: the cache has not seen it yet.
		default:
			p.waiters.Forget(claim, ch)
			return nil, fmt.Errorf("reading Machine %s: %w", key, err)
		}
		if !m.DeletionTimestamp.IsZero() {
			p.waiters.Forget(claim, ch)
			return nil, fmt.Errorf("Machine %s for NodeClaim %s is being deleted", key, claim)
		}
		if m.Spec.ProviderID != "" {
			p.waiters.Forget(claim, ch)
			delivered(m)
			return m, nil
		}
		reason, failed, err := p.launchFailure(ctx, m)
		if err != nil {
			p.waiters.Forget(claim, ch)
			return nil, err
		}
		if !failed {
			// The instance has an ID before it booted: the launch is done.
			id, err := launch.ProviderIDOf(ctx, p.hub, m)
			if err != nil {
				p.waiters.Forget(claim, ch)
				return nil, err
			}
			if id != "" {
				p.waiters.Forget(claim, ch)
				delivered(m)
				return m, nil
			}
		}
		left := p.LaunchTimeout
		if !m.CreationTimestamp.IsZero() {
			left = m.CreationTimestamp.Add(p.LaunchTimeout).Sub(p.now())
		}
		if left <= 0 && !failed {
			// Past the timeout with nothing reported: failed only if its
			// offering stalls, not when it waits in the infrastructure's
			// queue behind other launches (progress).
			if v := p.progress.judge(claim, offeringKeyOf(m), m.CreationTimestamp.Time, p.now()); v.failed() {
				reason, failed = fmt.Sprintf("no providerID within %s (%s)", p.LaunchTimeout, v), true
				metrics.MachineLaunchFailures.WithLabelValues("timeout").Inc()
			} else {
				if !queuedLogged {
					log.FromContext(ctx).Info("launch past its timeout waits: other launches wait for the infrastructure too",
						"NodeClaim", claim, "Machine", key.String(), "timeout", p.LaunchTimeout)
					queuedLogged = true
				}
				left = queuedRecheck
			}
		}
		if failed {
			p.waiters.Forget(claim, ch)
			return nil, p.fail(ctx, m, claim, reason)
		}
		timeout := time.NewTimer(left)
		select {
		case <-ch:
			timeout.Stop()
			wokeAt = p.now()
		case <-timeout.C:
		case <-timer.C:
			p.waiters.Forget(claim, ch)
			return nil, fmt.Errorf("Machine %s for NodeClaim %s: %w", key, claim, ErrStillLaunching)
		case <-ctx.Done():
			p.waiters.Forget(claim, ch)
			return nil, ctx.Err()
		}
	}
}

// launchFailure reads the Machine's infrastructure machine for a failed
// launch, with the reader MachineDeployment mode uses too.
func (p *Provider) launchFailure(ctx context.Context, m *clusterv1.Machine) (string, bool, error) {
	f, err := launch.ReadFailure(ctx, p.hub, m)
	if err != nil || !f.Failed {
		return "", false, err
	}
	if f.InsufficientCapacity {
		metrics.MachineLaunchFailures.WithLabelValues("insufficient_capacity").Inc()
	} else {
		metrics.MachineLaunchFailures.WithLabelValues("failed").Inc()
	}
	return f.Message, true, nil
}

// fail gives up on a Machine's launch: its offering is left out for the
// TTL and the Machine removed (Cluster API removes its infrastructure
// machine and bootstrap config).
func (p *Provider) fail(ctx context.Context, m *clusterv1.Machine, claim, reason string) error {
	if o, err := ParseOffering(m.Annotations[v1alpha1.OfferingAnnotation]); err == nil {
		if it := m.Annotations[v1alpha1.InstanceTypeAnnotation]; it != "" {
			p.unavailable.Mark(instancetype.OfferingKey{InstanceType: it, Zone: o.Zone, CapacityType: o.CapacityType}, reason)
		}
	}
	if err := p.deleteMachine(ctx, m); err != nil && !errors.Is(err, ErrMachineGone) {
		return err
	}
	if p.Events != nil {
		p.Events.Eventf(m, corev1.EventTypeWarning, "LaunchFailed", "Launch for NodeClaim %s failed, Machine deleted and offering %s left out for %s: %s",
			claim, m.Annotations[v1alpha1.OfferingAnnotation], p.unavailable.TTL(), reason)
	}
	return &failedLaunchError{machine: m.Name, err: cloudprovider.NewInsufficientCapacityError(fmt.Errorf("NodeClaim %s: launch of Machine %s/%s failed: %s", claim, m.Namespace, m.Name, reason))}
}

// failedLaunchError is a launch the infrastructure reported failed: its
// Machine was removed and its offering left out, so another may be tried.
// It is Karpenter's InsufficientCapacityError for whoever gets it.
type failedLaunchError struct {
	machine string
	err     error
}

func (e *failedLaunchError) Error() string { return e.err.Error() }
func (e *failedLaunchError) Unwrap() error { return e.err }

// queuedRecheck is how often a launch past its timeout that waits in a
// queue is judged again (events wake it sooner).
const queuedRecheck = 10 * time.Second

// offeringKeyOf reads the offering a Machine was launched from; the zero key
// when its annotations do not say.
func offeringKeyOf(m *clusterv1.Machine) instancetype.OfferingKey {
	o, err := ParseOffering(m.Annotations[v1alpha1.OfferingAnnotation])
	if err != nil {
		return instancetype.OfferingKey{}
	}
	return instancetype.OfferingKey{InstanceType: m.Annotations[v1alpha1.InstanceTypeAnnotation], Zone: o.Zone, CapacityType: o.CapacityType}
}

// deleteMachine deletes exactly this Machine (UID precondition).
func (p *Provider) deleteMachine(ctx context.Context, m *clusterv1.Machine) error {
	err := p.hub.GetClient().Delete(ctx, m, client.Preconditions{UID: &m.UID})
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return ErrMachineGone
	case apierrors.IsConflict(err):
		return ErrMachineGone // a Machine of the same name but another UID: ours is gone
	default:
		metrics.HubErrors.WithLabelValues("delete_machine").Inc()
		return fmt.Errorf("deleting Machine %s/%s: %w", m.Namespace, m.Name, err)
	}
}

// Delete starts the removal of the NodeClaim's Machine. It returns
// ErrMachineGone once the Machine is gone (a live read said so).
func (p *Provider) Delete(ctx context.Context, claim string, m *clusterv1.Machine) error {
	if m == nil {
		return ErrMachineGone
	}
	if !m.DeletionTimestamp.IsZero() {
		return nil
	}
	if m.Annotations[v1alpha1.NodeClaimAnnotation] != claim || !p.machines.Owned(m) {
		return fmt.Errorf("Machine %s/%s is not bound to NodeClaim %s: not touching it", m.Namespace, m.Name, claim)
	}
	if err := p.deleteMachine(ctx, m); err != nil {
		return err
	}
	if p.Events != nil {
		p.Events.Event(m, corev1.EventTypeNormal, "Deleted", "NodeClaim "+claim+" deleted: Machine deleted")
	}
	return nil
}
