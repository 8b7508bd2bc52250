package machinedeployment

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/failpoint"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/launch"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
)

// DefaultLaunchWait bounds how long Launch waits for a Machine's providerID
// before returning a retryable error; the reservation it made survives.
const DefaultLaunchWait = 2 * time.Minute

// ErrMachineGone means the Machine is truly gone (a live read said so).
var ErrMachineGone = launch.ErrMachineGone

// ErrStillLaunching is returned when no providerID arrived within the wait.
var ErrStillLaunching = launch.ErrStillLaunching

// ErrNodeClaimDeleted is Launch's answer once its NodeClaim is being
// deleted or is gone: no Machine is ever bound to such a NodeClaim (the
// binding rule), so nothing is left to wait for, and core lets the
// NodeClaim go only after Create returns. Its reservation stays until the
// NodeClaim is gone; then the next NodeClaim takes it or it is given back.
var ErrNodeClaimDeleted = errors.New("being deleted: launch abandoned")

// Provider implements MachineDeployment mode: Launch reserves a replica
// through the writer and waits for the controller to bind the Machine the
// MachineSet makes; Release marks the Machine and lowers its replica.
type Provider struct {
	hub      *hub.Hub
	machines *hub.Lookup
	store    *instancetype.Store
	waiters  *hub.Waiters
	writer   *writer
	locks    mdLocks
	barrier  barrier
	// spoke and spokeAPI read NodeClaims (cached, live): set by NewController.
	spoke, spokeAPI client.Reader
	// unavailable holds offerings left out after a failed launch (shared
	// with Machine mode).
	unavailable *launch.Unavailable
	view        unavailableView
	// infraWatch wakes a launch on its infrastructure machine's events.
	infraWatch *launch.InfraWatch
	// LaunchWait bounds one Launch call's wait for a providerID.
	LaunchWait time.Duration
	// MoveAfter is how long a reservation waits for a Machine before its
	// launch moves to another member of the same offering (DefaultMoveAfter).
	MoveAfter time.Duration
	// Events, when set, records events on hub objects.
	Events record.EventRecorder
	now    func() time.Time
	// after starts a launch wait (time.After; a test's clock may fire it at once).
	after func(time.Duration) <-chan time.Time
	// wake, when set, queues a MachineDeployment for the controller.
	wake func(types.NamespacedName)
	// gone caches live reads that found a NodeClaim gone (see goneClaims).
	gone goneClaims
}

// NewProvider returns the MachineDeployment mode provider.
func NewProvider(h *hub.Hub, managed *hub.ManagedMachines, store *instancetype.Store, unavailable *launch.Unavailable) *Provider {
	p := &Provider{
		hub:         h,
		unavailable: unavailable,
		machines:    hub.NewLookup(h, managed),
		store:       store,
		waiters:     hub.NewWaiters(),
		LaunchWait:  DefaultLaunchWait,
		MoveAfter:   DefaultMoveAfter,
		Events:      h.GetEventRecorderFor("karpenter-clusterapi"), //nolint:staticcheck // the recorder core uses too
		now:         time.Now,
		after:       time.After,
	}
	p.barrier.now = func() time.Time { return p.now() }
	p.gone.now = func() time.Time { return p.now() }
	p.writer = &writer{
		client: h.GetClient(), cache: h.GetCache(), live: h.GetAPIReader(), locks: &p.locks,
		free: p.claimFree,
		bindable: func(ctx context.Context, m *clusterv1.Machine) bool {
			return p.spoke != nil && noRegisteredNode(ctx, p.spoke, m)
		},
		written: func(o client.Object) { p.barrier.record("MachineDeployment", o) },
		latest: func(md *clusterv1.MachineDeployment) *clusterv1.MachineDeployment {
			return latest(&p.barrier, "MachineDeployment", client.ObjectKeyFromObject(md), md)
		},
		events:  p.Events,
		observe: func(n int) { metrics.MachineDeploymentWriteBatch.Observe(float64(n)) },
		onError: func(error) { metrics.HubErrors.WithLabelValues("update_machinedeployment").Inc() },
		bound: func(ctx context.Context, claim string) bool {
			m, err := p.BoundMachine(ctx, claim)
			return err != nil || m != nil // an error is no proof of none
		},
		queues:       map[types.NamespacedName]*writeQueue{},
		lowerSpacing: DefaultLowerSpacing,
	}
	p.infraWatch = launch.NewInfraWatch(h, p.claimOfInfra, p.waiters.Notify)
	return p
}

// SetLowerSpacing sets the least time between two lowering writes of a
// MachineDeployment (DefaultLowerSpacing; tests on a clock of their own set 0).
func (p *Provider) SetLowerSpacing(d time.Duration) { p.writer.lowerSpacing = d }

// SetClock replaces the provider's clock (tests).
func (p *Provider) SetClock(now func() time.Time) { p.now = now }

// SetLaunchTimer replaces how a launch wait is timed (tests: a timer that
// fires at once makes Launch look once and return, no real-time wait).
func (p *Provider) SetLaunchTimer(after func(time.Duration) <-chan time.Time) { p.after = after }

// Launch makes sure a replica is reserved for the NodeClaim and returns the
// Machine bound to it once it has a providerID. It resumes what an earlier
// call (of this process or one before a restart) started: a bound Machine
// or a reservation is never started again. chosen is the MachineDeployment
// an earlier call chose (recorded on the NodeClaim), or nil; choose is
// called only when nothing was chosen or the choice can no longer be used,
// and record is told the choice before the replica is raised, so that a
// retry after an ambiguous failure raises on the same MachineDeployment,
// where reserving is idempotent, and never on a second one.
//
// A launch the infrastructure reports failed makes its offering
// unavailable, releases exactly its Machine, and tries the next cheapest
// offering within the same call; when none is left the
// InsufficientCapacityError goes to Karpenter.
func (p *Provider) Launch(ctx context.Context, claim string, chosen *types.NamespacedName, record func(types.NamespacedName), choose Choose) (*clusterv1.Machine, error) {
	failedMachines := map[string]bool{}
	for {
		m, err := p.launchOnce(ctx, claim, chosen, record, choose)
		var failed *launchFailedError
		if !errors.As(err, &failed) || failedMachines[failed.machine] {
			return m, err // a Machine failing twice: no progress, Karpenter retries
		}
		failedMachines[failed.machine] = true
		chosen = nil // choose again: the failed offering is unavailable now
		if _, chooseErr := choose(nil); chooseErr != nil {
			return nil, err
		}
	}
}

// Choose picks the MachineDeployment a NodeClaim reserves on: the cheapest
// offering's, spread over its members. With avoid set it picks another
// member than avoid (an error when there is none).
type Choose func(avoid *types.NamespacedName) (instancetype.Source, error)

// DefaultMoveAfter is how long a reservation waits for its MachineSet to
// make a Machine before the launch moves to another member of the same
// offering (design doc, "Launch's wait"): core deletes a NodeClaim not
// launched within 5 minutes, and a MachineSet that made nothing for it in
// a minute is behind (paused, held, or a queue of hundreds).
const DefaultMoveAfter = time.Minute

// errMoveDue ends a launch wait when its reservation has waited MoveAfter.
var errMoveDue = errors.New("reservation waited long enough to move")

func (p *Provider) launchOnce(ctx context.Context, claim string, chosen *types.NamespacedName, record func(types.NamespacedName), choose Choose) (*clusterv1.Machine, error) {
	deadline := p.after(p.LaunchWait)
	for {
		m, err := p.BoundMachine(ctx, claim)
		if err != nil {
			return nil, err
		}
		var moveAt time.Time
		if m == nil {
			reserved, at, err := p.reservation(ctx, claim)
			if err != nil {
				return nil, err
			}
			if reserved == nil {
				origin, err := p.reserve(ctx, claim, chosen, record, choose)
				if err != nil {
					return nil, err
				}
				// The cache may not show the reservation yet: its place and
				// (about) its stamp are known.
				chosen, moveAt = origin, p.now().Add(p.MoveAfter)
			} else {
				to, err := p.moveIfBehind(ctx, claim, *reserved, at, record, choose)
				if err != nil {
					return nil, err
				}
				if to != nil {
					// The cache may not show the new reservation yet.
					chosen, moveAt = to, p.now().Add(p.MoveAfter)
				} else if !at.IsZero() && at.Add(p.MoveAfter).After(p.now()) {
					moveAt = at.Add(p.MoveAfter)
				}
			}
		}
		m, err = p.waitForProviderID(ctx, claim, deadline, moveAt)
		if errors.Is(err, errMoveDue) {
			continue
		}
		return m, err
	}
}

// reserve reserves a replica for the claim on the MachineDeployment chosen
// before, or, when that one is gone or cannot be used now, on a new choice.
// It returns the MachineDeployment reserved on.
func (p *Provider) reserve(ctx context.Context, claim string, chosen *types.NamespacedName, record func(types.NamespacedName), choose Choose) (*types.NamespacedName, error) {
	origin := chosen
	if origin != nil && !p.usable(*origin) {
		origin = nil // gone, no longer a member, or its records unreadable: choose again
	}
	if origin == nil {
		src, err := choose(nil)
		if err != nil {
			return nil, err
		}
		origin = &src.Origin
		record(src.Origin)
		failpoint.Crash(StepChoose)
	}
	in := &intent{kind: intentReserve, claim: claim}
	if err := p.writer.do(ctx, *origin, in); err != nil {
		return nil, fmt.Errorf("reserving a replica of MachineDeployment %s for NodeClaim %s: %w", origin, claim, err)
	}
	if in.err != nil {
		// At max-size, or the MachineDeployment cannot be used: Karpenter
		// re-plans on another offering.
		return nil, cloudprovider.NewInsufficientCapacityError(fmt.Errorf("NodeClaim %s: %w", claim, in.err))
	}
	if in.took != "" {
		metrics.OrphansReleased.WithLabelValues("taken_over").Inc()
	}
	if p.wake != nil {
		p.wake(*origin)
	}
	failpoint.Crash(StepReserve)
	return origin, nil
}

// usable reports whether a MachineDeployment is offered now: in the store
// (a member in scope) and usable (its Source has no error).
func (p *Provider) usable(md types.NamespacedName) bool {
	src, ok := p.store.Get(md)
	return ok && src.Err == nil
}

// reservedOn returns the MachineDeployment holding a reservation for the
// claim, or nil.
func (p *Provider) reservedOn(ctx context.Context, claim string) (*types.NamespacedName, error) {
	mds := &clusterv1.MachineDeploymentList{}
	if err := p.hub.GetCache().List(ctx, mds, client.MatchingFields{hub.IndexMachineDeploymentPendingClaim: claim}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("looking up MachineDeployments reserved for NodeClaim %s: %w", claim, err)
	}
	for i := range mds.Items {
		if mds.Items[i].DeletionTimestamp.IsZero() {
			key := client.ObjectKeyFromObject(&mds.Items[i])
			return &key, nil
		}
	}
	return nil, nil
}

// reservation returns the MachineDeployment holding a reservation for the
// claim and its stamp (zero when unknown), or nil. A reservation a Machine
// took up (a live Machine of that MachineDeployment annotated with the
// claim, made at or after the stamp) is done, as every write decides
// (plan), although the records may list it for up to TakeUpDelay: when
// that Machine is no longer bound (released after a failed launch), the
// claim reserves again.
func (p *Provider) reservation(ctx context.Context, claim string) (*types.NamespacedName, time.Time, error) {
	key, err := p.reservedOn(ctx, claim)
	if err != nil || key == nil {
		return key, time.Time{}, err
	}
	md := &clusterv1.MachineDeployment{}
	if err := p.hub.GetCache().Get(ctx, *key, md, client.UnsafeDisableDeepCopy); err != nil {
		return key, time.Time{}, nil
	}
	pending, err := hub.PendingNodeClaims(md)
	if err != nil {
		return key, time.Time{}, nil
	}
	at, _ := stampOf(md, pending[claim])
	if !at.IsZero() && p.takenUp(ctx, md, claim, at) {
		return nil, time.Time{}, nil
	}
	return key, at, nil
}

// takenUp reports whether a live Machine of the MachineDeployment annotated
// with the claim was made for its reservation stamped at (the cache; a
// read error says no: the reservation stands).
func (p *Provider) takenUp(ctx context.Context, md *clusterv1.MachineDeployment, claim string, at time.Time) bool {
	list := &clusterv1.MachineList{}
	if err := p.hub.GetCache().List(ctx, list, client.InNamespace(md.Namespace), client.MatchingFields{hub.IndexMachineNodeClaim: claim}, client.UnsafeDisableDeepCopy); err != nil {
		return false
	}
	for i := range list.Items {
		m := &list.Items[i]
		if m.Labels[clusterv1.MachineDeploymentNameLabel] == md.Name && m.DeletionTimestamp.IsZero() && madeFor(m, at) {
			return true
		}
	}
	return false
}

// waitForProviderID waits until the Machine bound to the claim has a
// providerID (or its infrastructure reports a failure). It stops at once,
// with ErrNodeClaimDeleted, when the NodeClaim is being deleted or gone
// (the NodeClaim watch wakes it), and with ErrStillLaunching once deadline
// fires. With moveAt set it stops with errMoveDue at that time if no
// Machine is bound yet: the caller looks at moving the reservation.
func (p *Provider) waitForProviderID(ctx context.Context, claim string, deadline <-chan time.Time, moveAt time.Time) (*clusterv1.Machine, error) {
	var wokeAt time.Time // when the last Machine event woke us
	var moveDue <-chan time.Time
	if !moveAt.IsZero() {
		moveDue = p.after(moveAt.Sub(p.now()))
	}
	for {
		ch := p.waiters.Register(claim)
		m, err := p.BoundMachine(ctx, claim)
		if err != nil {
			p.waiters.Forget(claim, ch)
			return nil, err
		}
		if m != nil {
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
		if p.claimLeaving(ctx, claim) {
			p.waiters.Forget(claim, ch)
			return nil, fmt.Errorf("NodeClaim %s: %w", claim, ErrNodeClaimDeleted)
		}
		select {
		case <-ch:
			wokeAt = p.now()
		case <-moveDue:
			moveDue = nil // once: a test's timer fires at once, before its time
			if m == nil && !p.now().Before(moveAt) {
				p.waiters.Forget(claim, ch)
				return nil, errMoveDue
			}
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

// BoundMachine returns the live Machine bound to the NodeClaim and not
// marked by the provider, or nil. A Machine this process wrote lately (a
// binding, a mark) that the cache does not show as written yet is taken as
// that write returned it.
func (p *Provider) BoundMachine(ctx context.Context, claim string) (*clusterv1.Machine, error) {
	m, err := p.machines.Bound(ctx, claim)
	if err != nil {
		return nil, err
	}
	if m != nil {
		if m, err = p.fresh(ctx, m); err != nil {
			return nil, err
		}
		if p.boundTo(m, claim) {
			return m, nil
		}
	}
	// Bound by this process lately, and the cache does not show it: the
	// Machine as the binding returned it. One the cache does not have (a
	// first pass binds on a live list) is read live.
	key, ok := p.barrier.boundTo(claim)
	if !ok {
		return nil, nil
	}
	cached := &clusterv1.Machine{}
	err = p.hub.GetCache().Get(ctx, key, cached)
	if err == nil {
		if m := latest(&p.barrier, "Machine", key, cached); p.boundTo(m, claim) {
			return m, nil
		}
		return nil, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading Machine %s: %w", key, err)
	}
	live := &clusterv1.Machine{}
	if err := p.hub.GetAPIReader().Get(ctx, key, live); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading Machine %s: %w", key, err)
	}
	if p.boundTo(live, claim) {
		return live, nil
	}
	return nil, nil
}

// fresh returns the cached Machine, or the Machine as this process last
// wrote it when the cache does not show that write yet.
func (p *Provider) fresh(_ context.Context, m *clusterv1.Machine) (*clusterv1.Machine, error) {
	return latest(&p.barrier, "Machine", client.ObjectKeyFromObject(m), m), nil
}

// boundTo reports whether m is the NodeClaim's: live, annotated with it,
// not marked by the provider, in scope.
func (p *Provider) boundTo(m *clusterv1.Machine, claim string) bool {
	return m != nil && m.DeletionTimestamp.IsZero() && !markedByUs(m) && p.machines.Owned(m) && m.Annotations[v1alpha1.NodeClaimAnnotation] == claim
}

// NodeClaimDeleted is told of a NodeClaim's deletion (the NodeClaim watch),
// begun (its deletionTimestamp set) or ended (gone): a Launch waiting for
// it stops (ErrNodeClaimDeleted), and the MachineDeployments that reserved
// for it look again at once, so that its reservation is free for the next
// NodeClaim without waiting once it is gone.
func (p *Provider) NodeClaimDeleted(claim string) {
	p.waiters.Notify(claim)
	if p.wake == nil {
		return
	}
	if md, err := p.reservedOn(context.Background(), claim); err == nil && md != nil {
		p.wake(*md)
	}
}

// MachineDeleted is told of a Machine that is gone (the Machine watch's
// delete event, which carries the Machine as it was last, deletionTimestamp
// included). A bound Machine someone else deleted leaves its replica to its
// NodeClaim: a reservation stamped at its creation, so the Machine the
// MachineSet makes in its place is bound to the NodeClaim, or, once the
// NodeClaim is gone, given back with it. A Machine the provider released
// for a NodeClaim that is leaving counts too: the writer reclaims only a
// replica still spare, which is one whose lowering never happened (refused,
// or cut short by a crash). One released for a failed launch does not: its
// NodeClaim launches elsewhere.
func (p *Provider) MachineDeleted(ctx context.Context, m *clusterv1.Machine) error {
	claim := m.Annotations[v1alpha1.NodeClaimAnnotation]
	md := m.Labels[clusterv1.MachineDeploymentNameLabel]
	if claim == "" || md == "" || m.DeletionTimestamp.IsZero() || !p.machines.Owned(m) {
		return nil
	}
	if markedByUs(m) && !p.claimLeaving(ctx, claim) {
		return nil
	}
	return p.writer.do(ctx, types.NamespacedName{Namespace: m.Namespace, Name: md},
		&intent{kind: intentReclaim, claim: claim, at: m.CreationTimestamp.Time, released: markedByUs(m)})
}

// claimLeaving reports whether the NodeClaim is being deleted (the spoke
// cache shows its deletionTimestamp) or gone (claimFree: the cache and a
// live read say NotFound). No spoke reader, or a read error, is no proof:
// false.
func (p *Provider) claimLeaving(ctx context.Context, claim string) bool {
	if p.spoke == nil {
		return false
	}
	nc := &karpv1.NodeClaim{}
	switch err := p.spoke.Get(ctx, types.NamespacedName{Name: claim}, nc, client.UnsafeDisableDeepCopy); {
	case err == nil:
		return !nc.DeletionTimestamp.IsZero()
	case apierrors.IsNotFound(err):
		return p.claimFree(ctx, claim)
	}
	return false
}

// claimFree reports whether a reservation's NodeClaim is gone: the cache
// says NotFound and a live read confirms it (an error is never read as
// gone). A NodeClaim still terminating keeps its reservation: core makes
// its successor only once it is gone, and the successor takes it then.
func (p *Provider) claimFree(ctx context.Context, claim string) bool {
	if isMoved(claim) {
		return true // a launch moved on: no NodeClaim has the key
	}
	if p.spoke == nil {
		return false
	}
	nc := &karpv1.NodeClaim{}
	if err := p.spoke.Get(ctx, types.NamespacedName{Name: claim}, nc, client.UnsafeDisableDeepCopy); !apierrors.IsNotFound(err) {
		return false
	}
	if p.gone.confirmed(claim) {
		return true
	}
	return apierrors.IsNotFound(p.gone.readLive(ctx, p.spokeAPI, claim, nc))
}
