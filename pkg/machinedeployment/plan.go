package machinedeployment

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

// ErrAtMaxSize refuses a raise past the max-size annotation.
var ErrAtMaxSize = errors.New("at its max size (" + instancetype.MaxSizeAnnotation + ")")

// errNotCovered: a lowering the provider's marks do not cover was left out
// of the write; the replica stays up until they do.
var errNotCovered = errors.New("lowering would make the MachineSet remove a Machine the provider has not marked: replica left up")

// errMarkedFirst: the provider's mark would cover the lowering, but a
// Machine someone else marked sorts before it (Cluster API takes marked
// Machines by name), so the MachineSet would remove that one instead. As
// in a rollout, a release removes its Machine directly (design doc, "Release").
var errMarkedFirst = fmt.Errorf("%w: a Machine someone else marked for deletion sorts first and would go instead", errNotCovered)

// intentKind is what a caller wants of a MachineDeployment's replicas and
// records (docs/design/machinedeployment-binding.md, "Intents").
type intentKind int

const (
	// intentReserve reserves a replica for a NodeClaim: nothing when it
	// has one, else the oldest free reservation, else a raise.
	intentReserve intentKind = iota
	// intentLower lowers the replica of a Machine the provider marked
	// (bound to the NodeClaim), while it is still owed.
	intentLower
	// intentGiveBack gives a free reservation back with a Machine made for
	// it, which the provider marked.
	intentGiveBack
	// intentReclaim reserves, for the NodeClaim of a bound Machine someone
	// else deleted, the replica that Machine leaves, stamped at the deletion.
	intentReclaim
	// intentStranded hands over the replica of a reservation no Machine can
	// serve: its MachineSet has settled with no Machine made since its
	// stamp (someone lowered the replicas and the MachineSet removed
	// Karpenter's Machine for it). owned-1, replicas unchanged: the
	// replica is the lowerer's; the NodeClaim raises again.
	intentStranded
	// intentMove re-keys the NodeClaim's open reservation as a free one
	// (movedKey) when no Machine is bound to it and none it could be bound
	// to exists: its launch reserves on another MachineDeployment. No
	// count changes.
	intentMove
	// intentSpare hands over replicas Karpenter counts but no NodeClaim,
	// reservation or marked Machine accounts for (a bound Machine someone
	// else deleted while no process of the provider saw it go), once the
	// MachineSet has settled: owned minus the spare, replicas unchanged.
	intentSpare
)

// intent is one change asked of the writer; the outcome fields are set by plan.
type intent struct {
	kind    intentKind
	claim   string             // NodeClaim (or reservation key)
	machine *clusterv1.Machine // intentLower, intentGiveBack: the marked Machine
	at      time.Time          // intentReclaim: the stamp
	// released (intentReclaim): the deleted Machine carried the
	// provider's mark; its replica is spare only beyond the lowerings the
	// live released Machines still owe.
	released bool
	// why is said in the log line and the event.
	why string

	// Outcome.
	err    error  // refused (max-size, not covered, unreadable records)
	done   bool   // the records or replicas changed for it
	raised bool   // intentReserve raised a replica
	took   string // intentReserve took this free reservation
	atMin  bool   // a lowering at min-size: owned-1 only, the replica passes on
	// stays (intentMove): the NodeClaim has a reservation or a bound
	// Machine here, whether or not it moved.
	stays bool
}

// view is what plan reads besides the MachineDeployment: its Machines and
// which NodeClaims are free (gone or terminating).
type view struct {
	machines []*clusterv1.Machine
	// sets are the MachineDeployment's MachineSets (nil: not read; the
	// Machines alone then tell whether one MachineSet holds them).
	sets []*clusterv1.MachineSet
	// free reports whether a reservation's NodeClaim is gone or terminating.
	free func(claim string) bool
	// bindable reports whether a Machine has no Node or one that awaits
	// registration (nil: any Machine without a nodeRef).
	bindable func(m *clusterv1.Machine) bool
	// bound reports whether a NodeClaim has a bound Machine, this
	// process's bindings the cache does not show yet included (nil: the
	// Machines alone tell).
	bound func(claim string) bool
}

// outcome is a planned write.
type outcome struct {
	recs     records
	replicas int32
	changed  bool
	// takenUp counts the reservations dropped because a Machine took
	// them up (done: nothing waits for their removal).
	takenUp int
	// lines say each replica change: for the log and the MachineDeployment's event.
	lines []string
}

// counts are the derived facts of one MachineDeployment (design doc, "Derived").
type counts struct {
	all, deleting, marked int32
	bound                 int32
	// released: live Machines bound to a NodeClaim that carry the
	// provider's mark, each owing at most one lowering.
	released int32
	// boundTo: NodeClaim -> its bound Machine.
	boundTo map[string]*clusterv1.Machine
	// annotated: NodeClaim -> every Machine annotated with it.
	annotated map[string][]*clusterv1.Machine
}

func count(machines []*clusterv1.Machine, extraMarked map[string]bool) counts {
	c := counts{boundTo: map[string]*clusterv1.Machine{}, annotated: map[string][]*clusterv1.Machine{}}
	for _, m := range machines {
		c.all++
		claim := m.Annotations[v1alpha1.NodeClaimAnnotation]
		if claim != "" {
			c.annotated[claim] = append(c.annotated[claim], m)
		}
		if !m.DeletionTimestamp.IsZero() {
			c.deleting++
			continue
		}
		if markedByUs(m) || extraMarked[m.Name] {
			c.marked++
			if claim != "" && markedByUs(m) {
				c.released++
			}
			continue
		}
		if claim != "" {
			c.bound++
			c.boundTo[claim] = m
		}
	}
	return c
}

// used reports whether a reservation stamped at was taken up by a live
// Machine annotated with its NodeClaim (bound, or marked since): made at or
// after the stamp. A Machine being deleted does not use it: someone else
// deleted it, and the reservation (a reclaim, stamped at its creation)
// waits for the Machine the MachineSet makes in its place.
func (c counts) used(claim string, at time.Time) bool {
	for _, m := range c.annotated[claim] {
		if m.DeletionTimestamp.IsZero() && madeFor(m, at) {
			return true
		}
	}
	return false
}

// plan decides one write: it normalizes the records (stamps, used
// reservations, others' lowering, debt), applies the intents in order and
// keeps every lowering within what the provider's marks cover. It changes
// nothing itself: the writer sends the outcome.
func plan(md *clusterv1.MachineDeployment, recs records, v view, intents []*intent) outcome {
	for _, in := range intents { // a retry after a conflict decides afresh
		in.err, in.done, in.raised, in.took, in.atMin, in.stays = nil, false, false, "", false, false
	}
	v.free = onceEach(v.free)
	out := outcome{recs: records{owned: recs.owned, hasOwned: recs.hasOwned, pending: map[string]time.Time{}}}
	r0 := ptr.Deref(md.Spec.Replicas, 0)
	r := r0
	extra := map[string]bool{}
	for _, in := range intents {
		// Marked by the caller (the cache may not show it yet): a Machine
		// bound to the NodeClaim it releases, or an unbound one it gives a
		// reservation back with. Any other is not the caller's to mark.
		if in.machine == nil {
			continue
		}
		claim := in.machine.Annotations[v1alpha1.NodeClaimAnnotation]
		if in.kind == intentLower && claim == in.claim || in.kind == intentGiveBack && claim == "" {
			extra[in.machine.Name] = true
		}
	}
	c := count(v.machines, extra)
	changed := recs.legacy || !recs.hasOwned

	// 1. Stamps: an unstamped reservation was added by the provider's
	// latest write, whose server time is on the object read.
	managed := managerTime(md)
	for claim, at := range recs.pending {
		if at.IsZero() && !managed.IsZero() {
			at, changed = managed, true
		}
		out.recs.pending[claim] = at
	}
	// 2. Reservations a Machine took up are done.
	for claim, at := range out.recs.pending {
		if !at.IsZero() && c.used(claim, at) {
			delete(out.recs.pending, claim)
			out.takenUp++
			changed = true
		}
	}
	// 3. No count yet (a new member, or the records were removed): the
	// bound Machines and the reservations are Karpenter's.
	owned := recs.owned
	if !recs.hasOwned {
		owned = c.bound + int32(len(out.recs.pending))
	}
	// Someone lowered the replicas below Karpenter's count: they took
	// Karpenter's replicas (the MachineSet removes Machines by its order).
	if owned > r {
		owned, changed = r, true
	}
	// 4. Debt: reservations no replica backs are dropped, free ones first,
	// then the newest: their NodeClaims raise again, stamped anew.
	if debt := c.bound + int32(len(out.recs.pending)) - owned; debt > 0 {
		for _, claim := range dropOrder(out.recs.pending, v.free) {
			if debt <= 0 {
				break
			}
			delete(out.recs.pending, claim)
			out.lines = append(out.lines, fmt.Sprintf("reservation of NodeClaim %s dropped: someone else lowered the replicas under Karpenter's", claim))
			debt--
			changed = true
		}
	}

	minSize, maxSize, hasMax, sizeErr := sizeBounds(md)
	// The gate (the one place that refuses a lowering): low is the
	// MachineSet Cluster API takes a lowering from. uncovered is how many
	// of its Machines that are neither deleting nor marked by the provider
	// it would remove after losing d replicas, in its own order (removals).
	low := lowers(md, v.sets, v.machines)
	order := removalsOf(low.machines, extra)
	uncovered := func(d int32) int32 { return order.uncovered(low.base, d) }
	spare := func() int32 { return owned - c.bound - int32(len(out.recs.pending)) }
	lower := func(in *intent, what string) bool {
		switch {
		case sizeErr != nil:
			in.err = sizeErr
			return false
		case r-1 < minSize:
			owned--
			in.atMin, in.done = true, true
			out.lines = append(out.lines, fmt.Sprintf("%s: replicas stay %d at min-size, the replica passes to whoever set it", what, r))
			return true
		case low.err != nil:
			in.err = low.err
			return false
		case !low.covers(in.machine):
			in.err = errLowersElsewhere
			return false
		case r0-(r-1) > low.room || uncovered(r0-(r-1)) > uncovered(0):
			in.err = errNotCovered
			if order.othersFirst(low.base, r0-(r-1)) {
				in.err = errMarkedFirst
			}
			return false
		}
		out.lines = append(out.lines, fmt.Sprintf("replicas %d -> %d: %s", r, r-1, what))
		r--
		owned--
		in.done = true
		return true
	}

	for _, in := range intents {
		switch in.kind {
		case intentReserve:
			if _, ok := out.recs.pending[in.claim]; ok {
				continue
			}
			if _, ok := c.boundTo[in.claim]; ok {
				continue
			}
			if k := oldestFree(out.recs.pending, v.free, in.claim); k != "" {
				out.recs.pending[in.claim] = out.recs.pending[k]
				delete(out.recs.pending, k)
				in.took, in.done, changed = k, true, true
				out.lines = append(out.lines, fmt.Sprintf("NodeClaim %s takes the reserved replica of NodeClaim %s, which is gone", in.claim, k))
				continue
			}
			if sizeErr != nil {
				in.err = sizeErr
				continue
			}
			if hasMax && r+1 > maxSize {
				in.err = fmt.Errorf("MachineDeployment %s/%s: %w", md.Namespace, md.Name, ErrAtMaxSize)
				continue
			}
			out.lines = append(out.lines, fmt.Sprintf("replicas %d -> %d: raised for NodeClaim %s", r, r+1, in.claim))
			r++
			owned++
			out.recs.pending[in.claim] = time.Time{}
			in.raised, in.done, changed = true, true, true
		case intentLower:
			if at, ok := out.recs.pending[in.claim]; ok && madeFor(in.machine, at) {
				delete(out.recs.pending, in.claim) // the reservation it was made for
				changed = true
			}
			if spare() <= 0 {
				continue // lowered already
			}
			if lower(in, fmt.Sprintf("Machine %s of NodeClaim %s %s", in.machine.Name, in.claim, in.why)) {
				changed = true
			}
		case intentGiveBack:
			at, ok := out.recs.pending[in.claim]
			if !ok || !madeFor(in.machine, at) {
				continue
			}
			delete(out.recs.pending, in.claim)
			if lower(in, fmt.Sprintf("the replica reserved for NodeClaim %s, which is gone, given back with Machine %s", in.claim, in.machine.Name)) {
				changed = true
			} else {
				out.recs.pending[in.claim] = at
			}
		case intentReclaim:
			owed := int32(0)
			if in.released {
				owed = c.released
			}
			if _, ok := out.recs.pending[in.claim]; ok || spare() <= owed {
				continue
			}
			out.recs.pending[in.claim] = in.at
			in.done, changed = true, true
			out.lines = append(out.lines, fmt.Sprintf("NodeClaim %s reclaims the replica of its Machine, deleted by someone else", in.claim))
		case intentSpare:
			if n := spare(); n > 0 && settled(c, r) && c.marked == 0 {
				owned -= n
				in.done, changed = true, true
				out.lines = append(out.lines, fmt.Sprintf("%d replica(s) Karpenter counted but no NodeClaim or Machine of its own accounts for left to others (a bound Machine deleted unseen)", n))
			}
		case intentMove:
			at, ok := out.recs.pending[in.claim]
			bound := c.boundTo[in.claim] != nil || v.bound != nil && v.bound(in.claim)
			if in.stays = ok || bound; !ok || at.IsZero() || bound || eligibleExists(v, at) {
				continue // a Machine is bound to it, or one it can be bound to exists: it stays
			}
			delete(out.recs.pending, in.claim)
			out.recs.pending[movedKey(out.recs.pending, in.claim)] = at
			in.done, changed = true, true
			out.lines = append(out.lines, fmt.Sprintf("NodeClaim %s moves to another MachineDeployment: its MachineSet made no Machine for it; the replica stays, free for the next NodeClaim", in.claim))
		case intentStranded:
			at, ok := out.recs.pending[in.claim]
			// A marked Machine the MachineSet keeps stands in for the
			// replica until it goes (kept): not stranded meanwhile.
			if !ok || !settled(c, r) || c.marked > 0 || eligibleExists(v, at) {
				continue
			}
			delete(out.recs.pending, in.claim)
			owned--
			in.done, changed = true, true
			out.lines = append(out.lines, fmt.Sprintf("reservation of NodeClaim %s dropped and its replica left to others: the MachineSet settled at %d replicas with no Machine made since the raise", in.claim, r))
		}
	}
	out.recs.owned, out.recs.hasOwned = max(owned, 0), true
	out.replicas = r
	out.changed = changed || r != r0
	return out
}

// settled reports whether the MachineSet has as many Machines as replicas,
// none being deleted.
func settled(c counts, r int32) bool { return c.all == r && c.deleting == 0 }

// eligibleExists reports whether a Machine a reservation stamped at could
// be bound to (or given back with) exists: live, unbound, unmarked, made at
// or after the stamp, with no Node or one that awaits registration.
func eligibleExists(v view, at time.Time) bool {
	for _, m := range v.machines {
		if !m.DeletionTimestamp.IsZero() || isMarked(m) || m.Annotations[v1alpha1.NodeClaimAnnotation] != "" || !madeFor(m, at) {
			continue
		}
		if v.bindable != nil && !v.bindable(m) || v.bindable == nil && m.Status.NodeRef.IsDefined() {
			continue
		}
		return true
	}
	return false
}

// oldestFree returns the oldest reservation whose NodeClaim is free (gone
// or terminating), other than for, or "".
// onceEach asks free at most once per NodeClaim within one plan: a batch
// of reservations asks for the oldest free one per intent, and the answer
// does not change within one decision (bench-1000: one NodeClaim read per
// reservation per intent was most of the provider's own CPU).
func onceEach(free func(string) bool) func(string) bool {
	if free == nil {
		return nil
	}
	seen := map[string]bool{}
	return func(claim string) bool {
		v, ok := seen[claim]
		if !ok {
			v = free(claim)
			seen[claim] = v
		}
		return v
	}
}

func oldestFree(pending map[string]time.Time, free func(string) bool, for_ string) string {
	best := ""
	for k, at := range pending {
		if k == for_ || free == nil || !free(k) {
			continue
		}
		if best == "" || at.Before(pending[best]) || (at.Equal(pending[best]) && k < best) {
			best = k
		}
	}
	return best
}

// dropOrder lists reservations to drop for a debt: free ones first, then
// the newest.
func dropOrder(pending map[string]time.Time, free func(string) bool) []string {
	keys := make([]string, 0, len(pending))
	for k := range pending {
		keys = append(keys, k)
	}
	isFree := func(k string) bool { return free != nil && free(k) }
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if fa, fb := isFree(a), isFree(b); fa != fb {
			return fa
		}
		ta, tb := pending[a], pending[b]
		if ta.IsZero() != tb.IsZero() {
			return ta.IsZero() // unstamped: the latest raise
		}
		if !ta.Equal(tb) {
			return ta.After(tb)
		}
		return a > b
	})
	return keys
}

// describe summarizes a write for logs.
func describe(lines []string) string { return strings.Join(lines, "; ") }
