package machinedeployment

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/failpoint"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
	"github.com/autonode/karpenter-clusterapi/pkg/spoke"
)

// The binding protocol of docs/design/machinedeployment-binding.md: bind
// Machines made for a raise to the NodeClaims they were raised for, give
// back what belongs to NodeClaims that are gone, settle spare replicas.

// reconcileBindings binds new Machines to pending NodeClaims, drops pending
// entries that are bound, forgets released Machines that are gone, gives
// back what belongs to NodeClaims that no longer exist, and settles owned
// replicas that no NodeClaim uses (see OwnedReplicasAnnotation). It returns
// when to look again.
func (c *Controller) reconcileBindings(ctx context.Context, md *clusterv1.MachineDeployment) (time.Duration, error) {
	p := c.provider
	key := client.ObjectKeyFromObject(md)
	pending, err := hub.PendingNodeClaims(md)
	if err != nil {
		return 0, err
	}
	pendingCount := int32(len(pending))
	pendingBefore := maps.Clone(pending)
	released, err := hub.ReleasedMachines(md)
	if err != nil {
		return 0, err
	}
	held, err := heldReplicas(md)
	if err != nil {
		return 0, err
	}
	owned, hasOwned, ownedErr := ownedReplicas(md)
	if ownedErr != nil {
		log.FromContext(ctx).Error(ownedErr, "counting the owned replicas again", "MachineDeployment", key)
	}
	machines := &clusterv1.MachineList{}
	if err := p.hub.GetCache().List(ctx, machines, client.InNamespace(md.Namespace),
		client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
		return 0, fmt.Errorf("listing Machines of MachineDeployment %s: %w", key, err)
	}
	newest, err := c.newestMachineSet(ctx, md)
	if err != nil {
		return 0, err
	}
	now := p.now()
	var ops []*op
	var requeue time.Duration
	later := func(d time.Duration) {
		if requeue == 0 || d < requeue {
			requeue = d
		}
	}

	var holds []*op
	var cleanups []*op
	oldestCleanup := now
	cleanup := func(o *op, since time.Time) {
		cleanups = append(cleanups, o)
		if since.Before(oldestCleanup) {
			oldestCleanup = since
		}
	}

	recentlyBound := func(m *clusterv1.Machine) bool { return p.recent.machineBound(m.Namespace + "/" + m.Name) }
	use := measure(machines.Items, pendingBefore, released, ptr.Deref(md.Spec.Replicas, 0), newest, recentlyBound)
	// debt > 0: owned replicas no NodeClaim uses and none held (a
	// Karpenter Machine was deleted by someone else); < 0: NodeClaims hold
	// more than is counted.
	debt := owned - use.bound - pendingCount - int32(len(held))

	existing := map[string]bool{}
	var candidates []*clusterv1.Machine
	for i := range machines.Items {
		m := &machines.Items[i]
		existing[m.Name] = true
		if claim := m.Annotations[v1alpha1.NodeClaimAnnotation]; claim != "" {
			// A Machine released by the provider (marked: its launch
			// failed, or its NodeClaim went) keeps the annotation but is
			// not the claim's any more: the claim was raised for again,
			// and that reservation awaits a Machine of its own. Taking it
			// as bound dropped the new reservation, and the claim never
			// launched (model seeds 20, 44).
			if since, ok := pending[claim]; ok && !isMarked(m) {
				cleanup(&op{kind: opBound, name: claim}, since)
				delete(pending, claim)
			}
			if released[m.Name] && isMarked(m) {
				// Released already (marked, its replica given back): it
				// waits for the MachineSet, which keeps it while others
				// hold the replicas up. An op for it would change nothing
				// yet hold back settling spare replicas forever (model
				// seed 7: nine spare replicas never given back).
				continue
			}
			if gone, err := c.orphaned(ctx, m, claim, now); err != nil {
				return 0, err
			} else if gone {
				if wait := c.adoptWait(ctx, m, claim, now); wait > 0 {
					later(wait) // its successor may adopt it (Provider.adopt)
					continue
				}
				if !p.takeovers.beginBind(claim) {
					continue // adopted by a successor since the cache's read
				}
				log.FromContext(ctx).Info("releasing Machine whose NodeClaim is gone", "Machine", client.ObjectKeyFromObject(m), "NodeClaim", claim)
				c.event(c.hubEvents, m, corev1.EventTypeNormal, "OrphanReleased", fmt.Sprintf("NodeClaim %s is gone: marked for deletion and its replica given back", claim))
				err := p.markForDeletion(ctx, m)
				p.takeovers.endBind(claim)
				if errors.Is(err, ErrMachineGone) || errors.Is(err, errMachineDeleting) {
					continue // the cache lags: nothing to give back here
				} else if err != nil {
					return 0, err
				}
				ops = append(ops, releaseOp(m, claim))
				metrics.OrphansReleased.WithLabelValues("machine").Inc()
			} else if m.DeletionTimestamp.IsZero() {
				later(OrphanGrace)
			}
			continue
		}
		// Bound is decided by the nodeclaim annotation alone: the member
		// label may come from the MachineDeployment's Machine template
		// (ClusterClass topology copies a topology's labels there), and
		// then every new Machine carries it unbound.
		if c.bindable(ctx, m) && !recentlyBound(m) {
			candidates = append(candidates, m)
		}
	}
	for name := range released {
		if !existing[name] {
			cleanup(&op{kind: opForget, name: name}, time.Time{})
		}
	}

	// Oldest claim gets the oldest new Machine.
	claims := make([]string, 0, len(pending))
	for claim := range pending {
		claims = append(claims, claim)
	}
	sort.Slice(claims, func(i, j int) bool {
		if !pending[claims[i]].Equal(pending[claims[j]]) {
			return pending[claims[i]].Before(pending[claims[j]])
		}
		return claims[i] < claims[j]
	})
	sort.Slice(candidates, func(i, j int) bool {
		return candidates[i].CreationTimestamp.Before(&candidates[j].CreationTimestamp)
	})
	taken := map[string]bool{} // Machines bound or given back in this pass
	for _, claim := range claims {
		since := pending[claim]
		// A Machine bound elsewhere (another MachineSet, or a race) settles
		// it, and so does a binding this process made that the cache does
		// not show yet, unless that Machine went away since: the claim was
		// raised for again and needs another. That Machine may be another
		// MachineDeployment's (a claim with a reservation on each): looking
		// only among this one's Machines bound a second Machine to the
		// claim (model seed 33).
		if ok, err := p.recentlyBoundAlive(ctx, claim); err != nil {
			return 0, err
		} else if ok {
			cleanup(&op{kind: opBound, name: claim}, since)
			continue
		}
		if m, err := p.BoundMachine(ctx, claim); err != nil {
			return 0, err
		} else if m != nil {
			cleanup(&op{kind: opBound, name: claim}, since)
			continue
		}
		gone, err := c.nodeClaimGone(ctx, claim, since, now)
		if err != nil {
			return 0, err
		}
		if gone {
			// Karpenter deletes a NodeClaim whose launch outlasts its
			// launch timeout; the MachineSet may still be making the
			// Machine for it (a burst of hundreds on one
			// MachineDeployment). Giving the replica back would make the
			// MachineSet undo that work and the next NodeClaim's raise
			// redo it: the replica is held for the next reservation
			// instead, and given back only if none takes it
			// (giveBackHeld). It is logged, evented and counted once
			// the write did it: on a cache that lags, a pass may
			// decide a hold already made.
			hold := &op{kind: opHold, name: claim, since: now}
			holds = append(holds, hold)
			ops = append(ops, hold)
			p.inflight.Delete(claim)
			later(OrphanGrace)
			continue
		}
		// Machines raised for NodeClaims come after them. No exception
		// for a spare replica: it is given back (settleOwned), never a
		// licence to bind a Machine that was not made for a raise.
		idx := -1
		for i, m := range candidates {
			if !taken[m.Name] && madeFor(m, since) {
				idx = i
				break
			}
		}
		if idx < 0 {
			if o, err := c.stranded(ctx, md, claim, since, use, taken, now); errors.Is(err, errMachineChanged) {
				later(time.Second) // its victim changed since the cache's read: decide again
				continue
			} else if err != nil {
				return 0, err
			} else if o != nil {
				ops = append(ops, o)
				continue
			}
			later(OrphanGrace)
			continue
		}
		m := candidates[idx]
		if !p.takeovers.beginBind(claim) {
			// Gone, and a Launch took its reservation over since the
			// cache's read: the Machine is the successor's.
			later(time.Second)
			continue
		}
		candidates = append(candidates[:idx], candidates[idx+1:]...)
		err = c.bind(ctx, m, claim)
		p.takeovers.endBind(claim)
		if err != nil {
			if changedSinceRead(err) || apierrors.IsNotFound(err) {
				log.FromContext(ctx).V(1).Info("binding again in a second", "Machine", client.ObjectKeyFromObject(m), "NodeClaim", claim, "reason", err.Error())
				later(time.Second)
				continue
			}
			return 0, err
		}
		taken[m.Name] = true
		cleanup(&op{kind: opBound, name: claim}, since)
	}

	if wait, err := c.giveBackHeld(ctx, md, held, use, taken, now); err != nil {
		return 0, err
	} else if wait > 0 {
		later(wait)
	}

	// A spare replica (debt > 0) means the MachineSet removed another
	// marked Machine in place of a released one (say, one a crashed
	// Release had marked): the spare is given back with the kept Machine
	// (settleOwned), which makes no new Machine. Deleting the kept Machine
	// directly would (e2e kill test: three Machines too many).
	if debt <= 0 {
		if wait, err := c.deleteKeptReleased(ctx, md, use, now); err != nil {
			return 0, err
		} else if wait > 0 {
			later(wait)
		}
	}

	var settle *op
	if len(ops) == 0 {
		var wait time.Duration
		if settle, wait, err = c.settleOwned(ctx, md, owned, hasOwned, debt, use, taken, now); err != nil {
			return 0, err
		}
		if wait > 0 {
			later(wait)
		}
		if settle != nil {
			ops = append(ops, settle)
		}
	} else if debt != 0 {
		later(time.Second) // settle once the counting writes are in
	}

	// Bookkeeping that changes no count rides along with the next counting
	// write, or goes alone once it is cleanupDelay old: a burst then costs
	// the MachineDeployment a few writes, not one per bound Machine.
	if len(ops) == 0 && len(cleanups) > 0 {
		if wait := cleanupDelay - now.Sub(oldestCleanup); wait > 0 {
			later(wait)
			cleanups = nil
		}
	}
	ops = append(ops, cleanups...)
	if len(ops) > 0 {
		if err := p.scaler.Apply(ctx, key, ops...); err != nil {
			return 0, err
		}
		if settle != nil && hasOwned {
			c.debts.decided(key, owned, now)
		}
		if settle != nil && settle.reclaimed && settle.marked != nil {
			// A NodeClaim reclaimed the replica (its Machine was deleted
			// by someone else) since the read: the Machine marked for the
			// give-back may be bound to it.
			if err := p.unmarkSpare(ctx, settle.marked); err != nil {
				return 0, err
			}
		}
		for _, o := range holds {
			if o.done {
				log.FromContext(ctx).Info("holding the replica of a NodeClaim that is gone for the next one", "MachineDeployment", key, "NodeClaim", o.name)
				c.event(c.hubEvents, md, corev1.EventTypeNormal, "ReplicaHeld",
					fmt.Sprintf("NodeClaim %s is gone before a Machine was bound to it: its replica is held for the next NodeClaim for %s", o.name, OrphanGrace))
				metrics.OrphansReleased.WithLabelValues("held").Inc()
			}
		}
	}
	return requeue, nil
}

// giveBackHeld gives back the held replicas no reservation took within
// OrphanGrace of being held, once the MachineSet has settled (as many live
// Machines as spec.replicas), each with an unbound Machine made for its raise
// when there is one (marked first, or the MachineSet would pick one by its
// own deletion order, possibly a bound one). Machines taken in this pass
// (bound, or marked for another replica) are left alone. It returns when to
// look again.
//
// While the MachineSet still makes Machines, the NodeClaims whose launches
// timed out are the ones it is working for, and Karpenter makes their
// successors as fast as it can plan them, which at hundreds of pods takes
// longer than OrphanGrace (found by make bench-1000: 450 held replicas
// given back 30 s after a mass timeout, and the MachineSet deleted the
// Machines it had made for them). A held replica costs nothing until its
// Machine exists, and the MachineSet settles only once it does.
//
// A held replica, unlike a reservation, may be taken by any Launch at any
// moment, and under load the cache shows takes seconds late (found by make
// bench-1000: 187 give-backs decided in a minute, 4 of them real): the
// decision is made on a live read, applied at once, and a Machine marked
// for a give-back that did not happen (taken meanwhile) is unmarked.
func (c *Controller) giveBackHeld(ctx context.Context, md *clusterv1.MachineDeployment, held map[string]heldReplica, use usage, taken map[string]bool, now time.Time) (time.Duration, error) {
	due := func(held map[string]heldReplica) ([]string, time.Duration) {
		var keys []string
		var next time.Duration
		for k, h := range held {
			if wait := OrphanGrace - now.Sub(h.Held); wait > 0 {
				if next == 0 || wait < next {
					next = wait
				}
				continue
			}
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool {
			if a, b := held[keys[i]], held[keys[j]]; !a.Held.Equal(b.Held) {
				return a.Held.Before(b.Held)
			}
			return keys[i] < keys[j]
		})
		return keys, next
	}
	settling := func(md *clusterv1.MachineDeployment) bool {
		return md.Spec.Replicas == nil || *md.Spec.Replicas != use.live
	}
	if keys, next := due(held); len(keys) == 0 {
		return next, nil
	} else if settling(md) {
		return 5 * time.Second, nil // the Machines it makes wake this up sooner
	}
	key := client.ObjectKeyFromObject(md)
	live := &clusterv1.MachineDeployment{}
	if err := c.provider.hub.GetAPIReader().Get(ctx, key, live); err != nil {
		return 0, fmt.Errorf("reading MachineDeployment %s: %w", key, err)
	}
	if settling(live) {
		return 5 * time.Second, nil
	}
	held, err := heldReplicas(live)
	if err != nil {
		return 0, err
	}
	keys, next := due(held)
	var ops []*op
	victims := map[*op]*clusterv1.Machine{}
	for _, k := range keys {
		h := held[k]
		o := &op{kind: opGiveBackHeld, name: k}
		if victim := pickVictim(use.victims, taken, h.Raised.Add(-bindSkew)); victim != nil {
			if err := c.provider.markSpare(ctx, victim); errors.Is(err, errMachineChanged) {
				next = time.Second // bound or changed since the cache's read: decide again
				continue
			} else if err != nil {
				return 0, err
			}
			taken[victim.Name] = true
			victims[o] = victim
		}
		ops = append(ops, o)
	}
	if len(ops) == 0 {
		return next, nil
	}
	err = c.provider.scaler.Apply(ctx, key, ops...)
	for _, o := range ops {
		switch {
		case err == nil && o.done:
			log.FromContext(ctx).Info("giving back a held replica no NodeClaim took", "MachineDeployment", key, "NodeClaim", o.name)
			c.event(c.hubEvents, md, corev1.EventTypeNormal, "ReplicaGivenBack",
				fmt.Sprintf("the replica held since NodeClaim %s went away was not taken within %s: given back", o.name, OrphanGrace))
			metrics.OrphansReleased.WithLabelValues("replica").Inc()
		case err == nil && victims[o] != nil:
			// Taken since the live read: its Machine may serve the
			// NodeClaim that took it.
			if uerr := c.provider.unmarkSpare(ctx, victims[o]); uerr != nil {
				return 0, uerr
			}
		}
	}
	if err != nil {
		// The marks stay: a give-back retried next pass takes the Machine
		// it marked (spare marks go first), and one taken meanwhile
		// leaves a marked Machine that a spare or stranded reservation
		// gives back with.
		return 0, err
	}
	return next, nil
}

// newestMachineSet returns the name of the MachineDeployment's MachineSet
// whose template matches the MachineDeployment's (as Cluster API decides
// it), or "" when there is none yet.
func (c *Controller) newestMachineSet(ctx context.Context, md *clusterv1.MachineDeployment) (string, error) {
	ms, err := c.provider.machineSets(ctx, md)
	if err != nil {
		return "", err
	}
	if newest := newestOf(md, ms); newest != nil {
		return newest.Name, nil
	}
	return "", nil
}

// bind labels and annotates a Machine as the NodeClaim's. Only this
// controller binds (one leader, one reconcile per MachineDeployment at a
// time) and recent bindings are remembered until the cache shows them, so
// nothing binds concurrently; the patch's preconditions (bindPatch) keep a
// Machine that got a Node, a mark or another binding since the read from
// being bound (found by the model test).
func (c *Controller) bind(ctx context.Context, m *clusterv1.Machine, claim string) error {
	// The binding is decided on the cache, which lags a loaded hub by
	// seconds. When the Machine is not as read any more, it is read again
	// from the API server and, if it is still bindable (unbound, unmarked,
	// the same Machine, no Node but one awaiting registration), patched at
	// once on that read, up to bindAttempts times in one pass: a binding
	// that waits for the next pass leaves its Node waiting unregistered
	// while the pods it was made for go elsewhere (conformance runs bound
	// Machines 5-20 s late so).
	key := client.ObjectKeyFromObject(m)
	for attempt := 1; ; attempt++ {
		patch, err := bindPatch(m, claim)
		if err != nil {
			return fmt.Errorf("binding Machine %s to NodeClaim %s: %w", key, claim, err)
		}
		err = c.provider.hub.GetClient().Patch(ctx, m, patch)
		if err == nil {
			break
		}
		err = fmt.Errorf("binding Machine %s to NodeClaim %s: %w", key, claim, err)
		if !changedSinceRead(err) || attempt >= bindAttempts {
			return err
		}
		uid := m.UID
		fresh := &clusterv1.Machine{}
		if gerr := c.provider.hub.GetAPIReader().Get(ctx, key, fresh); gerr != nil {
			return fmt.Errorf("%w; reading it again: %w", err, gerr)
		}
		if fresh.UID != uid || !c.bindable(ctx, fresh) {
			log.FromContext(ctx).V(1).Info("not binding a Machine that changed since the cache's read", "Machine", key, "NodeClaim", claim)
			return err
		}
		m = fresh
	}
	c.provider.recent.add(claim, m, c.provider.now())
	c.provider.lost.forget(claim)
	c.provider.inflight.Delete(claim) // the raised replica is used
	failpoint.Crash(StepBind)
	log.FromContext(ctx).V(1).Info("bound Machine to NodeClaim", "Machine", client.ObjectKeyFromObject(m), "NodeClaim", claim)
	c.provider.waiters.Notify(claim)
	c.event(c.hubEvents, m, corev1.EventTypeNormal, "Bound", "bound to NodeClaim "+claim)
	nc := &karpv1.NodeClaim{}
	if err := c.spoke.Get(ctx, types.NamespacedName{Name: claim}, nc); err == nil {
		c.event(c.spokeEvents, nc, corev1.EventTypeNormal, "MachineBound", fmt.Sprintf("Machine %s/%s of MachineDeployment %s bound", m.Namespace, m.Name, m.Labels[clusterv1.MachineDeploymentNameLabel]))
	}
	return nil
}

// adoptWait is how long a Machine whose NodeClaim is gone is left for a
// successor to adopt: adoptGrace from the NodeClaim's deletion, for a
// Machine that is not marked and has no registered Node (one a successor
// may adopt); else none. A deletion this process did not see (it happened
// before a restart) gives no wait.
func (c *Controller) adoptWait(ctx context.Context, m *clusterv1.Machine, claim string, now time.Time) time.Duration {
	deleted, ok := c.provider.goneSeen.since(claim)
	if !ok || !c.provider.adoptable(ctx, m) {
		return 0
	}
	return adoptGrace - now.Sub(deleted)
}

// orphaned reports whether a bound Machine's NodeClaim is gone for longer
// than the grace period, and the Machine is not being deleted already.
func (c *Controller) orphaned(ctx context.Context, m *clusterv1.Machine, claim string, now time.Time) (bool, error) {
	if !m.DeletionTimestamp.IsZero() {
		return false, nil
	}
	return c.nodeClaimGone(ctx, claim, m.CreationTimestamp.Time, now)
}

// nodeClaimGone reports whether a NodeClaim is gone for longer than the
// grace period (see spoke.NodeClaimGone).
func (c *Controller) nodeClaimGone(ctx context.Context, claim string, since, now time.Time) (bool, error) {
	return spoke.NodeClaimGone(ctx, c.spoke, c.spokeAPI, claim, since, now, OrphanGrace)
}
