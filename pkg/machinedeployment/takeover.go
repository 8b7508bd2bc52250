package machinedeployment

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/spoke"
)

// takeoverAge is how old a reservation must be before a Launch may take it
// over from a NodeClaim that is gone: far longer than the spoke cache takes
// to show a NodeClaim that was just created, so a claim missing from the
// cache is gone, not new (a live read confirms it).
const takeoverAge = 5 * time.Second

// takeoverMemory bounds how long a claim whose reservation was taken over is
// remembered (it is gone: nothing may bind it again).
const takeoverMemory = 10 * time.Minute

// Takeovers coordinate the controller's binding of a reserved NodeClaim
// with a Launch that takes the reservation of a NodeClaim that is gone.
//
// Karpenter deletes a NodeClaim whose launch outlasts its launch timeout and
// at once creates another for the same pods (its successor). When the
// successor's Launch comes before the controller's next pass has held the
// gone claim's replica, it used to raise a replica of its own: two replicas,
// two Machines for one NodeClaim (make bench-1000: replicas peaked at 1 054
// for 1 000 NodeClaims). The successor now takes the gone claim's
// reservation in its reserving write (see applyOps), with its raise time, so
// the Machine made for that raise is bound to the successor.
//
// A take and a bind of the same claim exclude each other: the controller
// binds a claim only between beginBind and endBind, a Launch takes a claim
// only while no bind of it is under way, and a taken claim is never bound.
type takeovers struct {
	mu    sync.Mutex
	busy  map[string]bool
	taken map[string]takenBy
}

type takenBy struct {
	by string
	at time.Time
}

// beginBind reports whether the controller may bind claim now (its
// reservation was not taken over); endBind must follow a true.
func (t *takeovers) beginBind(claim string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.taken[claim]; ok {
		return false
	}
	if t.busy == nil {
		t.busy = map[string]bool{}
	}
	t.busy[claim] = true
	return true
}

func (t *takeovers) endBind(claim string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.busy, claim)
}

// take reserves the gone claim's reservation for the claim by: false while
// the controller binds it, or when another claim took it.
func (t *takeovers) take(claim, by string, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.busy[claim] {
		return false
	}
	if e, ok := t.taken[claim]; ok && e.by != by {
		return false
	}
	if t.taken == nil {
		t.taken = map[string]takenBy{}
	}
	for c, e := range t.taken {
		if now.Sub(e.at) > takeoverMemory {
			delete(t.taken, c)
		}
	}
	t.taken[claim] = takenBy{by: by, at: now}
	return true
}

// untake gives a take back when the checks after it failed.
func (t *takeovers) untake(claim, by string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.taken[claim]; ok && e.by == by {
		delete(t.taken, claim)
	}
}

// goneClaims finds, for one write, the reservations a new claim may take
// over: those of claims that are gone. It is asked in the reserving write
// itself (applyOps), on the MachineDeployment that write updates, so the
// decision is made on the state the write replaces.
type goneClaims struct {
	ctx    context.Context
	p      *Provider
	sorted []string // pending claims, oldest raise first (computed once)
	next   int
	alive  map[string]bool
	takes  map[string]string // claim taken -> by, in this attempt
}

// settle gives back the takes of this attempt that its write did not
// carry out: all of them when the write failed (a conflict is decided
// again on a fresh read), else those no op used.
func (g *goneClaims) settle(batch []*op, written bool) {
	if g == nil {
		return
	}
	used := map[string]bool{}
	if written {
		for _, o := range batch {
			if o.from != "" {
				used[o.from] = true
			}
		}
	}
	for c, by := range g.takes {
		if !used[c] {
			g.p.takeovers.untake(c, by)
		}
	}
	g.takes = nil
}

// pick returns a pending claim that is gone, not bound, and not taken by
// another claim, whose reservation by may take over; "" when none.
func (g *goneClaims) pick(pending map[string]time.Time, by string) string {
	if g == nil || g.p == nil || g.p.spoke == nil || g.p.spokeAPI == nil {
		return ""
	}
	if g.sorted == nil {
		g.sorted = make([]string, 0, len(pending))
		for c := range pending {
			g.sorted = append(g.sorted, c)
		}
		sort.Slice(g.sorted, func(i, j int) bool {
			a, b := pending[g.sorted[i]], pending[g.sorted[j]]
			if !a.Equal(b) {
				return a.Before(b)
			}
			return g.sorted[i] < g.sorted[j]
		})
		g.alive = map[string]bool{}
	}
	now := g.p.now()
	for ; g.next < len(g.sorted); g.next++ {
		c := g.sorted[g.next]
		raised, ok := pending[c]
		if !ok || c == by || g.alive[c] {
			continue
		}
		if now.Sub(raised) < takeoverAge {
			// Sorted by raise: every later one is younger still.
			g.next = len(g.sorted)
			break
		}
		if g.takeable(c, by, raised, now) {
			g.next++
			return c
		}
		g.alive[c] = true
	}
	return ""
}

// takeable decides one claim: taken first (no bind may start), then
// checked; any doubt (an error, a binding, a claim that exists) gives the
// take back and leaves the reservation alone.
func (g *goneClaims) takeable(c, by string, raised, now time.Time) bool {
	p := g.p
	if !p.takeovers.take(c, by, now) {
		return false
	}
	ok := func() bool {
		gone, err := spoke.NodeClaimGone(g.ctx, p.spoke, p.spokeAPI, c, raised, now, takeoverAge)
		if err != nil || !gone {
			return false
		}
		// A binding this process made lately is decided on a live read:
		// a cache that lags may still show that Machine unbound and live
		// when someone else deleted it since (model seed 135: the
		// successor raised a replica beside a reservation whose Machine
		// the MachineSet had removed).
		if m, err := p.recentlyBound(g.ctx, c); err != nil || (m != nil && m.Annotations[v1alpha1.NodeClaimAnnotation] == c && m.DeletionTimestamp.IsZero() && !isMarked(m)) {
			return false
		}
		// A Machine someone else is deleting serves no one: its replica
		// is the reservation's, as if none had been bound (model seed
		// 135: the MachineSet removed a gone claim's Node-less Machine
		// after someone lowered the replicas, and the successor raised
		// another replica beside the reservation it could take).
		m, err := p.BoundMachine(g.ctx, c)
		return err == nil && (m == nil || !m.DeletionTimestamp.IsZero())
	}()
	if !ok {
		p.takeovers.untake(c, by)
		return false
	}
	if g.takes == nil {
		g.takes = map[string]string{}
	}
	g.takes[c] = by
	return true
}
