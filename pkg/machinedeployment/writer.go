package machinedeployment

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// writer is the one place that changes a MachineDeployment's replicas and
// records (docs/design/machinedeployment-binding.md, "The one write").
// Intents for one MachineDeployment that arrive while a write is in flight
// ride on the next write: a burst of NodeClaims costs one write per
// MachineDeployment, not one per NodeClaim. Every write is a merge patch of
// the fields it changes, with the resourceVersion it read; a conflict reads
// the MachineDeployment live and plans again.
type writer struct {
	client client.Client
	cache  client.Reader
	live   client.Reader
	locks  *mdLocks
	// free reports whether a reservation's NodeClaim is gone or terminating.
	free func(ctx context.Context, claim string) bool
	// bindable reports whether a Machine's Node (if any) awaits registration.
	bindable func(ctx context.Context, m *clusterv1.Machine) bool
	// written records each write for the barrier.
	written func(obj client.Object)
	// latest, when set, returns the MachineDeployment as this process last
	// wrote it when the cache does not show that write yet (the barrier):
	// a burst's writes one after another would each meet a conflict and a
	// live read on the cache's older copy.
	latest func(*clusterv1.MachineDeployment) *clusterv1.MachineDeployment
	events record.EventRecorder
	// observe, when set, is told the size of each batch written.
	observe func(int)
	// onError, when set, is told of each failed write.
	onError func(error)
	// bound reports whether a NodeClaim has a bound Machine (this
	// process's bindings the cache does not show yet included).
	bound func(ctx context.Context, claim string) bool
	// listedLive, when set, is told of each live read of a
	// MachineDeployment's Machines and MachineSets.
	listedLive func()

	// timeout bounds one write once it holds the lock (writeTimeout when 0).
	timeout time.Duration
	// lowerSpacing is the least time between two writes of a
	// MachineDeployment that only lower (Release's): the lowerings that
	// come meanwhile are written together (0: each batch at once).
	lowerSpacing time.Duration

	mu     sync.Mutex
	queues map[types.NamespacedName]*writeQueue
	// lowered: when each MachineDeployment's last lowering write was sent.
	lowered map[types.NamespacedName]time.Time
}

// DefaultLowerSpacing is the writer's lowerSpacing. A scale-down's
// NodeClaims are deleted over seconds (core's termination is rate
// limited); written one batch each, every lowering write made Cluster API
// reconcile every Machine of the MachineDeployment again (and its
// MachineSet). One write per 2 s at most keeps a single release immediate
// and a scale-down of any size to a few writes.
const DefaultLowerSpacing = 2 * time.Second

// writeTimeout bounds one write (its reads, its conflicts and the patch).
const writeTimeout = 30 * time.Second

type writeQueue struct {
	intents []*queued
	running bool
	// kick ends a lowering batch's wait: an intent that is not a
	// lowering came.
	kick chan struct{}
}

type queued struct {
	in   *intent
	done chan error
}

// do queues intents for a MachineDeployment and waits until they are
// written (or found to need nothing). The error is the write's; each
// intent's own refusal is in its err.
func (w *writer) do(ctx context.Context, md types.NamespacedName, intents ...*intent) error {
	qs := make([]*queued, len(intents))
	w.mu.Lock()
	q := w.queues[md]
	if q == nil {
		q = &writeQueue{kick: make(chan struct{}, 1)}
		w.queues[md] = q
	}
	for i, in := range intents {
		qs[i] = &queued{in: in, done: make(chan error, 1)}
		if in.kind != intentLower {
			select {
			case q.kick <- struct{}{}:
			default:
			}
		}
	}
	q.intents = append(q.intents, qs...)
	if !q.running {
		q.running = true
		go w.drain(md, q)
	}
	w.mu.Unlock()
	for _, x := range qs {
		select {
		case err := <-x.done:
			if err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (w *writer) drain(key types.NamespacedName, q *writeQueue) {
	for {
		w.mu.Lock()
		if wait := w.lowerWait(key, q.intents); wait > 0 {
			// Only lowerings, and the last lowering write was lately:
			// those that come meanwhile ride on this one.
			w.mu.Unlock()
			select {
			case <-time.After(wait):
			case <-q.kick:
			}
			w.mu.Lock()
		}
		batch := q.intents
		q.intents = nil
		if len(batch) == 0 {
			q.running = false
			delete(w.queues, key)
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		intents := make([]*intent, len(batch))
		for i, x := range batch {
			intents[i] = x.in
		}
		// The write's time starts once it holds the lock: a pass that
		// holds it is no reason for the write to fail.
		unlock := w.locks.lock(key)
		timeout := w.timeout
		if timeout == 0 {
			timeout = writeTimeout
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		err := w.write(ctx, key, intents)
		unlock()
		cancel()
		for _, x := range batch {
			x.done <- err
		}
	}
}

// lowerWait is how long a batch of queued intents waits for lowerSpacing;
// the caller holds w.mu.
func (w *writer) lowerWait(key types.NamespacedName, batch []*queued) time.Duration {
	if len(batch) == 0 || !onlyLowers(batch) {
		return 0
	}
	return w.lowerDue(key)
}

// lowerDue is how long a write that only lowers waits for lowerSpacing
// since the MachineDeployment's last lowering write; the caller holds w.mu.
func (w *writer) lowerDue(key types.NamespacedName) time.Duration {
	if w.lowerSpacing <= 0 {
		return 0
	}
	last, ok := w.lowered[key]
	if !ok {
		return 0
	}
	return time.Until(last.Add(w.lowerSpacing))
}

// lowersDue is lowerDue for a caller that does not hold w.mu (a pass).
func (w *writer) lowersDue(key types.NamespacedName) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lowerDue(key)
}

// wroteLowering records a write that lowered (any caller's).
func (w *writer) wroteLowering(key types.NamespacedName, intents []*intent) {
	for _, in := range intents {
		if in.kind == intentLower {
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.lowered == nil {
				w.lowered = map[types.NamespacedName]time.Time{}
			}
			w.lowered[key] = time.Now()
			return
		}
	}
}

// onlyLowers reports whether every queued intent is a lowering.
func onlyLowers(batch []*queued) bool {
	for _, x := range batch {
		if x.in.kind != intentLower {
			return false
		}
	}
	return true
}

// write plans and sends one write; the caller holds the MachineDeployment's lock.
func (w *writer) write(ctx context.Context, key types.NamespacedName, intents []*intent) error {
	md := &clusterv1.MachineDeployment{}
	if err := w.cache.Get(ctx, key, md); err != nil {
		if apierrors.IsNotFound(err) {
			err = w.live.Get(ctx, key, md)
		}
		if err != nil {
			return fmt.Errorf("reading MachineDeployment %s: %w", key, err)
		}
	}
	if w.latest != nil {
		md = w.latest(md)
	}
	// Lowerings and hand-overs are decided on the API server's Machines
	// and MachineSets: a Machine the cache does not show yet (one the
	// MachineSet made too many, or made for the reservation) would take
	// the mark that covers a lowering, or serve the reservation. The cache
	// is asked first: most calls with a lowering owe none (core retries
	// Delete until the Machine is gone, and each retry finds its lowering
	// written), and a no-op decided on a stale cache is only a later
	// lowering (the pass retries what is owed). Listed live at most once
	// per write: a conflict on the MachineDeployment re-reads only it.
	live := false
	machines, sets, err := w.machinesAndSets(ctx, w.cache, md)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		recs, err := readRecords(md)
		if err != nil {
			for _, in := range intents {
				in.err = err
			}
			return nil
		}
		free := func(claim string) bool { return w.free(ctx, claim) }
		var bindable func(*clusterv1.Machine) bool
		if w.bindable != nil {
			bindable = func(m *clusterv1.Machine) bool { return w.bindable(ctx, m) }
		}
		var bound func(string) bool
		if w.bound != nil {
			bound = func(claim string) bool { return w.bound(ctx, claim) }
		}
		out := plan(md, recs, view{machines: machines, sets: sets, free: free, bindable: bindable, bound: bound}, intents)
		if !live && needsLive(intents) {
			live = true
			if machines, sets, err = w.machinesAndSets(ctx, w.live, md); err != nil {
				return err
			}
			if w.listedLive != nil {
				w.listedLive()
			}
			attempt--
			continue
		}
		if !out.changed {
			return nil
		}
		before := md.DeepCopy()
		patch := client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})
		out.recs.apply(md)
		md.Spec.Replicas = ptr.To(out.replicas)
		err = w.client.Patch(ctx, md, patch, client.FieldOwner(FieldManager))
		if err == nil {
			w.written(md)
			w.wroteLowering(key, intents)
			if w.observe != nil {
				w.observe(len(intents))
			}
			w.report(ctx, md, ptr.Deref(before.Spec.Replicas, 0), out)
			return nil
		}
		if w.onError != nil {
			w.onError(err)
		}
		if !apierrors.IsConflict(err) || attempt >= 50 {
			return fmt.Errorf("updating MachineDeployment %s: %w", key, err)
		}
		md = &clusterv1.MachineDeployment{}
		if err := w.live.Get(ctx, key, md); err != nil {
			return fmt.Errorf("reading MachineDeployment %s: %w", key, err)
		}
	}
}

// machinesAndSets reads a MachineDeployment's Machines and MachineSets from r.
func (w *writer) machinesAndSets(ctx context.Context, r client.Reader, md *clusterv1.MachineDeployment) ([]*clusterv1.Machine, []*clusterv1.MachineSet, error) {
	machines, err := machinesOf(ctx, r, md)
	if err != nil {
		return nil, nil, err
	}
	sets, err := setsOf(ctx, r, md)
	if err != nil {
		return nil, nil, err
	}
	return machines, sets, nil
}

// needsLive reports whether a plan lowers, hands over, or refuses to do so
// (a refusal decides what the caller does next: Release deletes a Machine
// a rollout keeps the lowering off), or moves a launch (a Machine bound to
// the NodeClaim that the cache does not show, by a process before a
// restart, would keep it: the NodeClaim would be bound twice): such a plan
// is made again on the API server's Machines and MachineSets before
// anything is sent.
func needsLive(intents []*intent) bool {
	for _, in := range intents {
		switch in.kind {
		case intentLower, intentGiveBack, intentStranded, intentSpare, intentMove:
			if in.done || in.atMin || in.err != nil {
				return true
			}
		}
	}
	return false
}

// report says every replica change in one log line and one event.
func (w *writer) report(ctx context.Context, md *clusterv1.MachineDeployment, from int32, out outcome) {
	if len(out.lines) == 0 {
		return
	}
	msg := describe(out.lines)
	log.FromContext(ctx).Info("MachineDeployment replicas", "MachineDeployment", client.ObjectKeyFromObject(md),
		"from", from, "to", out.replicas, "owned", out.recs.owned, "changes", msg)
	if w.events != nil {
		reason := "ReplicasChanged"
		if out.replicas == from {
			reason = "ReservationsChanged"
		}
		w.events.Event(md, corev1.EventTypeNormal, reason, truncateEvent(fmt.Sprintf("replicas %d -> %d: %s", from, out.replicas, msg)))
	}
}

func truncateEvent(s string) string {
	if len(s) > 1000 {
		return s[:1000] + "…"
	}
	return s
}

// machinesOf lists a MachineDeployment's Machines, read-only. The
// selector names the MachineDeployment's Cluster too: a live list (the API
// reader) must stay inside the provider's scope, one Cluster of a shared
// namespace (docs/install.md; the e2e TestTwoClustersInOneNamespaceStayApart
// audits it).
func machinesOf(ctx context.Context, r client.Reader, md *clusterv1.MachineDeployment) ([]*clusterv1.Machine, error) {
	list := &clusterv1.MachineList{}
	selector := client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}
	if md.Spec.ClusterName != "" {
		selector[clusterv1.ClusterNameLabel] = md.Spec.ClusterName
	}
	if err := r.List(ctx, list, client.InNamespace(md.Namespace), selector, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing Machines of MachineDeployment %s/%s: %w", md.Namespace, md.Name, err)
	}
	out := make([]*clusterv1.Machine, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}

// setsOf lists a MachineDeployment's MachineSets, read-only, within the
// provider's scope like machinesOf.
func setsOf(ctx context.Context, r client.Reader, md *clusterv1.MachineDeployment) ([]*clusterv1.MachineSet, error) {
	list := &clusterv1.MachineSetList{}
	selector := client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}
	if md.Spec.ClusterName != "" {
		selector[clusterv1.ClusterNameLabel] = md.Spec.ClusterName
	}
	if err := r.List(ctx, list, client.InNamespace(md.Namespace), selector); err != nil {
		return nil, fmt.Errorf("listing MachineSets of MachineDeployment %s/%s: %w", md.Namespace, md.Name, err)
	}
	out := make([]*clusterv1.MachineSet, 0, len(list.Items))
	for i := range list.Items {
		if ms := &list.Items[i]; metav1.IsControlledBy(ms, md) || len(ms.OwnerReferences) == 0 {
			out = append(out, ms)
		}
	}
	return out, nil
}

// mdLocks serializes, per MachineDeployment, the writer's writes and the
// controller's passes, so that one process never decides twice on one state.
type mdLocks struct {
	mu    sync.Mutex
	locks map[types.NamespacedName]*sync.Mutex
}

func (l *mdLocks) lock(key types.NamespacedName) func() {
	l.mu.Lock()
	if l.locks == nil {
		l.locks = map[types.NamespacedName]*sync.Mutex{}
	}
	m := l.locks[key]
	if m == nil {
		m = &sync.Mutex{}
		l.locks[key] = m
	}
	l.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// refused returns the first refusal among intents.
func refused(intents ...*intent) error {
	for _, in := range intents {
		if in.err != nil {
			return in.err
		}
	}
	return nil
}

// isNotCovered reports whether a lowering was left out for lack of marks.
func isNotCovered(err error) bool { return errors.Is(err, errNotCovered) }

// deletesDirectly reports whether a release refused for err removes its
// Machine directly (its NodeClaim leaving): Cluster API would take the
// lowering off another Machine for a while nobody can bound (a rollout,
// or a Machine someone else marked that sorts first).
func deletesDirectly(err error) bool {
	return errors.Is(err, errLowersElsewhere) || errors.Is(err, errMarkedFirst)
}
