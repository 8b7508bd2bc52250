package machinedeployment

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/failpoint"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/launch"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
)

// DefaultLaunchWait bounds how long Launch waits for a Machine's providerID
// before returning a retryable error; the binding it started survives.
const DefaultLaunchWait = 2 * time.Minute

// ErrMachineGone means the Machine is truly gone (a live read said so).
var ErrMachineGone = launch.ErrMachineGone

// ErrStillLaunching is returned when no providerID arrived within the wait.
var ErrStillLaunching = launch.ErrStillLaunching

// Provider implements MachineDeployment mode.
type Provider struct {
	hub      *hub.Hub
	machines *hub.Lookup
	store    *instancetype.Store
	scaler   *Scaler
	waiters  *hub.Waiters
	// inflight maps a NodeClaim to the MachineDeployment this process raised
	// a replica for, until the hub cache shows the pending entry.
	inflight sync.Map
	// recent remembers the bindings this process made until the hub cache
	// shows them, so that a reconcile reading a cache that lags behind its
	// own writes never binds a second Machine to a NodeClaim, or a Machine
	// twice.
	recent recentBindings
	// lost remembers Machines bound to a NodeClaim that someone else
	// deleted before they launched, whose replicas the claims reclaim.
	lost lostMachines
	// takeovers coordinates binds with Launches taking the reservation of
	// a NodeClaim that is gone.
	takeovers takeovers
	// goneSeen remembers NodeClaims deleted lately, whose Machine a
	// successor may adopt.
	goneSeen goneClaimsSeen
	// spoke and spokeAPI read NodeClaims (cached, live): set by NewController.
	spoke, spokeAPI client.Reader
	// released remembers the Machines this process marked for deletion
	// until the cache shows the mark.
	released releasedMachines
	// unavailable holds offerings left out after a failed launch (shared
	// with Machine mode).
	unavailable *launch.Unavailable
	view        unavailableView
	// infraWatch wakes a launch on its infrastructure machine's events.
	infraWatch *launch.InfraWatch
	// LaunchWait bounds one Launch call's wait for a providerID.
	LaunchWait time.Duration
	// Events, when set, records events on Machines in the hub.
	Events record.EventRecorder
	now    func() time.Time
	// after starts a launch wait (time.After; a test's clock may fire it at once).
	after func(time.Duration) <-chan time.Time
}

// NewProvider returns the MachineDeployment mode provider.
func NewProvider(h *hub.Hub, managed *hub.ManagedMachines, store *instancetype.Store, unavailable *launch.Unavailable) *Provider {
	p := &Provider{
		hub:         h,
		unavailable: unavailable,
		machines:    hub.NewLookup(h, managed),
		store:       store,
		scaler:      newObservedScaler(h),
		waiters:     hub.NewWaiters(),
		LaunchWait:  DefaultLaunchWait,
		Events:      h.GetEventRecorderFor("karpenter-clusterapi"), //nolint:staticcheck // the recorder core uses too
		now:         time.Now,
		after:       time.After,
	}
	p.infraWatch = launch.NewInfraWatch(h, p.claimOfInfra, p.waiters.Notify)
	p.scaler.Gone = func(ctx context.Context) *goneClaims { return &goneClaims{ctx: ctx, p: p} }
	return p
}

// SetClock replaces the provider's clock (tests).
func (p *Provider) SetClock(now func() time.Time) { p.now = now }

// SetLaunchTimer replaces how a launch wait is timed (tests: a timer that
// fires at once makes Launch look once and return, no real-time wait).
func (p *Provider) SetLaunchTimer(after func(time.Duration) <-chan time.Time) { p.after = after }

// Scaler returns the provider's batched MachineDeployment writer.
func (p *Provider) Scaler() *Scaler { return p.scaler }

// Launch makes sure a Machine is bound to the NodeClaim and returns it once
// it has a providerID. It resumes what an earlier call (of this process or
// of one before a restart) started: a bound Machine or a raised replica is
// never started again. chosen is the MachineDeployment an earlier call
// chose (recorded on the NodeClaim), or nil; choose is called only when
// nothing was chosen or started yet, and record is told the choice before
// the replica is raised, so that a retry after an ambiguous failure (the
// update may have been applied) raises on the same MachineDeployment, where
// raising is idempotent, and never on a second one.
//
// A launch the infrastructure reports failed (see fail) makes its offering
// unavailable, gives its replica back with exactly its Machine, and tries
// the next cheapest offering within the same call: choose no longer sees
// the failed one. When none is left, the InsufficientCapacity error goes to
// Karpenter.
func (p *Provider) Launch(ctx context.Context, claim string, chosen *types.NamespacedName, record func(types.NamespacedName), choose func() (instancetype.Source, error)) (*clusterv1.Machine, error) {
	failedMachines := map[string]bool{}
	for {
		m, err := p.launchOnce(ctx, claim, chosen, record, choose)
		var failed *launchFailedError
		if !errors.As(err, &failed) || failedMachines[failed.machine] {
			return m, err // a Machine failing twice: no progress, Karpenter retries
		}
		failedMachines[failed.machine] = true
		chosen = nil // choose again: the failed offering is unavailable now
		if _, chooseErr := choose(); chooseErr != nil {
			return nil, err
		}
	}
}

func (p *Provider) launchOnce(ctx context.Context, claim string, chosen *types.NamespacedName, record func(types.NamespacedName), choose func() (instancetype.Source, error)) (*clusterv1.Machine, error) {
	m, err := p.BoundMachine(ctx, claim)
	if err != nil {
		return nil, err
	}
	if m == nil {
		started, err := p.reserved(ctx, claim)
		if err != nil {
			return nil, err
		}
		if !started {
			origin := chosen
			if origin != nil {
				md := &clusterv1.MachineDeployment{}
				if err := p.hub.GetCache().Get(ctx, *origin, md); apierrors.IsNotFound(err) {
					origin = nil // the earlier choice is gone: choose again
				} else if err != nil {
					return nil, fmt.Errorf("reading MachineDeployment %s chosen for NodeClaim %s: %w", origin, claim, err)
				}
			}
			if origin == nil {
				src, err := choose()
				if err != nil {
					return nil, err
				}
				origin = &src.Origin
				record(src.Origin)
				failpoint.Crash(StepChoose)
			}
			if adopted, err := p.adopt(ctx, *origin, claim); err != nil {
				return nil, err
			} else if adopted {
				return p.waitForProviderID(ctx, claim)
			}
			reserve := &op{kind: opReserve, name: claim, since: p.now()}
			if raised, ok := p.lost.reclaimable(claim, *origin, p.now()); ok {
				// Someone else deleted the Machine bound to the claim
				// before it launched: its replica is still the claim's.
				reserve = &op{kind: opReclaim, name: claim, since: raised}
			}
			if err := p.scaler.Apply(ctx, *origin, reserve); err != nil {
				if errors.Is(err, ErrAtMaxSize) {
					// Refused at the write: Karpenter re-plans on another
					// offering; the store shows this one unavailable as
					// soon as the cache has the replicas.
					return nil, cloudprovider.NewInsufficientCapacityError(fmt.Errorf("NodeClaim %s: %w", claim, err))
				}
				return nil, fmt.Errorf("raising replicas of MachineDeployment %s for NodeClaim %s: %w", origin, claim, err)
			}
			if reserve.kind == opReclaim {
				p.lost.forget(claim)
				if reserve.done {
					log.FromContext(ctx).Info("reclaimed the replica of a Machine someone else deleted before it launched", "NodeClaim", claim, "MachineDeployment", *origin)
				}
			}
			if reserve.from != "" {
				log.FromContext(ctx).Info("took over the reservation of a NodeClaim that is gone", "NodeClaim", claim, "MachineDeployment", *origin, "gone", reserve.from)
				metrics.OrphansReleased.WithLabelValues("taken_over").Inc()
			}
			p.inflight.Store(claim, *origin)
			failpoint.Crash(StepReserve)
		}
	}
	return p.waitForProviderID(ctx, claim)
}

// reserved reports whether a replica was already raised for the claim.
func (p *Provider) reserved(ctx context.Context, claim string) (bool, error) {
	if _, ok := p.inflight.Load(claim); ok {
		return true, nil
	}
	// Bound by this process, and the cache does not show it yet.
	if ok, err := p.recentlyBoundAlive(ctx, claim); err != nil || ok {
		return ok, err
	}
	mds := &clusterv1.MachineDeploymentList{}
	if err := p.hub.GetCache().List(ctx, mds, client.MatchingFields{hub.IndexMachineDeploymentPendingClaim: claim}); err != nil {
		return false, fmt.Errorf("looking up MachineDeployments pending for NodeClaim %s: %w", claim, err)
	}
	return len(mds.Items) > 0, nil
}

// recentlyBoundAlive reports whether the Machine this process bound to
// claim lately, which the cache may not show bound yet, still exists and is
// not being deleted, on whichever MachineDeployment. A binding whose Machine
// went away is forgotten: the claim needs another replica.
func (p *Provider) recentlyBoundAlive(ctx context.Context, claim string) (bool, error) {
	machine, ok := p.recent.claimMachine(claim, p.now())
	if !ok {
		return false, nil
	}
	ns, name, _ := strings.Cut(machine, "/")
	m := &clusterv1.Machine{}
	err := p.hub.GetCache().Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, m)
	switch {
	case err == nil && m.DeletionTimestamp.IsZero():
		return true, nil
	case err == nil || apierrors.IsNotFound(err):
		if b, ok := p.recent.binding(claim, p.now()); ok && !p.released.has(machine, p.now()) && (err != nil || !isMarked(m)) {
			p.lost.add(claim, b.md, b.created, p.now())
		}
		p.recent.forget(claim)
		return false, nil
	default:
		return false, fmt.Errorf("reading Machine %s bound to NodeClaim %s: %w", machine, claim, err)
	}
}

func (p *Provider) waitForProviderID(ctx context.Context, claim string) (*clusterv1.Machine, error) {
	deadline := p.after(p.LaunchWait)
	var wokeAt time.Time // when the last Machine event woke us
	for {
		ch := p.waiters.Register(claim)
		m, err := p.BoundMachine(ctx, claim)
		if err != nil {
			p.waiters.Forget(claim, ch)
			return nil, err
		}
		if m != nil {
			// The replica raised for the claim is used: should this
			// Machine go away, the claim is raised for again.
			p.inflight.Delete(claim)
			if !m.DeletionTimestamp.IsZero() {
				// Not marked by the provider (BoundMachine): someone
				// else deleted it, and its replica is the claim's still.
				p.lost.add(claim, types.NamespacedName{Namespace: m.Namespace, Name: m.Labels[clusterv1.MachineDeploymentNameLabel]}, m.CreationTimestamp.Time, p.now())
				p.waiters.Forget(claim, ch)
				return nil, fmt.Errorf("Machine %s/%s bound to NodeClaim %s is being deleted", m.Namespace, m.Name, claim)
			}
			if m.Spec.ProviderID != "" {
				p.waiters.Forget(claim, ch)
				p.inflight.Delete(claim)
				if !wokeAt.IsZero() {
					metrics.LaunchReturnDelay.Observe(time.Since(wokeAt).Seconds())
				}
				failpoint.Crash(StepLaunched)
				return m, nil
			}
			if ref := m.Spec.InfrastructureRef; ref.Name != "" {
				// A failure is seen when the infrastructure reports it,
				// not when Cluster API mirrors it onto the Machine.
				// Without the watch (an error), the Machine's own events
				// still wake the launch, later: not a reason to fail it.
				if err := p.infraWatch.EnsureFor(ctx, ref.APIGroup, ref.Kind); err != nil {
					log.FromContext(ctx).V(1).Info("not watching infrastructure machines", "kind", ref.Kind, "error", err.Error())
				}
			}
			f, err := launch.ReadFailure(ctx, p.hub, m)
			if err != nil {
				p.waiters.Forget(claim, ch)
				return nil, err
			}
			if f.Failed {
				p.waiters.Forget(claim, ch)
				return nil, p.fail(ctx, claim, m, f)
			}
			// The instance has an ID before it booted: the launch is done.
			id, err := launch.ProviderIDOf(ctx, p.hub, m)
			if err != nil {
				p.waiters.Forget(claim, ch)
				return nil, err
			}
			if id != "" {
				p.waiters.Forget(claim, ch)
				if !wokeAt.IsZero() {
					metrics.LaunchReturnDelay.Observe(time.Since(wokeAt).Seconds())
				}
				failpoint.Crash(StepLaunched)
				return m, nil
			}
		}
		select {
		case <-ch:
			wokeAt = p.now()
		case <-deadline:
			p.waiters.Forget(claim, ch)
			if m != nil {
				return nil, fmt.Errorf("Machine %s/%s for NodeClaim %s: %w", m.Namespace, m.Name, claim, ErrStillLaunching)
			}
			return nil, fmt.Errorf("NodeClaim %s: no Machine bound yet: %w", claim, ErrStillLaunching)
		case <-ctx.Done():
			p.waiters.Forget(claim, ch)
			return nil, ctx.Err()
		}
	}
}

// BoundMachine returns the Machine bound to the NodeClaim and not released
// (marked for deletion), or nil: a NodeClaim whose launch failed is raised
// for again.
func (p *Provider) BoundMachine(ctx context.Context, claim string) (*clusterv1.Machine, error) {
	m, err := p.machines.Bound(ctx, claim)
	if err != nil || m == nil {
		return nil, err
	}
	if isMarked(m) || p.released.has(m.Namespace+"/"+m.Name, p.now()) {
		return nil, nil
	}
	return m, nil
}

// machineSets lists the MachineSets of a MachineDeployment from the cache.
func (p *Provider) machineSets(ctx context.Context, md *clusterv1.MachineDeployment) ([]clusterv1.MachineSet, error) {
	list := &clusterv1.MachineSetList{}
	if err := p.hub.GetCache().List(ctx, list, client.InNamespace(md.Namespace),
		client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
		return nil, fmt.Errorf("listing MachineSets of MachineDeployment %s/%s: %w", md.Namespace, md.Name, err)
	}
	return list.Items, nil
}

func newObservedScaler(h *hub.Hub) *Scaler {
	s := NewScaler(h.GetClient(), h.GetCache(), h.GetAPIReader())
	s.Observe = func(n int) { metrics.MachineDeploymentWriteBatch.Observe(float64(n)) }
	s.OnError = func(error) { metrics.HubErrors.WithLabelValues("update_machinedeployment").Inc() }
	return s
}
