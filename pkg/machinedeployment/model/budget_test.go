package model

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// A pass over a MachineDeployment holds its lock, and every raise of
// Launch waits for that lock. At 1 000 Machines one pass bound or marked
// hundreds of Machines in one go and held the raises of a burst for tens of
// seconds (bench-1000). A pass now stops starting writes to Machines once
// it has held the lock for its budget and comes back at once for the rest:
// here a clock that moves 0.6 s each time the provider reads it makes every
// pass run out of budget after its first bind, and six reservations are
// bound over several short passes, none lost.
func TestAPassStopsAtItsBudgetAndBindsTheRestInTheNext(t *testing.T) {
	bindsOverPasses(t, 600*time.Millisecond, 2)
}

// A pass whose reads alone take longer than its budget (live reads of
// NodeClaims that are gone, at 1 000 NodeClaims under load) still binds:
// the budget starts at its first write, which every pass makes. Timed
// from the pass's start, no pass bound anything after a burst's launch
// timeouts (bench-1000, 217 Machines left unbound).
func TestAPassWhoseReadsOutlastItsBudgetStillBinds(t *testing.T) {
	bindsOverPasses(t, 5*time.Second, 1)
}

// bindsOverPasses makes six reservations and their Machines and runs
// passes with a clock that moves by tick each time the provider reads it,
// until all are bound; each pass must bind at least one and at most most.
func bindsOverPasses(t *testing.T, tick time.Duration, most int) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.stalled["cheap"] = true
	var claims []string
	for i := 0; i < 6; i++ {
		c := w.newClaim()
		_ = w.create(c)
		claims = append(claims, c)
	}
	if got := w.replicas("cheap"); got != 6 {
		t.Fatalf("cheap has %d replicas, want 6", got)
	}
	w.stalled["cheap"] = false
	w.runMachineSets()
	if got := w.liveMachines("cheap"); got != 6 {
		t.Fatalf("cheap has %d Machines, want 6", got)
	}
	boundCount := func() int {
		n := 0
		for _, c := range claims {
			if w.machineOf(c) != nil {
				n++
			}
		}
		return n
	}

	w.provider.SetClock(func() time.Time { w.now = w.now.Add(tick); return w.now })
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "cheap"}}
	passes := 0
	for boundCount() < len(claims) && passes < 20 {
		before := boundCount()
		res, err := w.controller.Reconcile(context.Background(), req)
		if err != nil {
			t.Fatalf("pass %d: %v", passes, err)
		}
		passes++
		if got := boundCount() - before; got > most || got < 1 {
			t.Fatalf("pass %d bound %d Machines, want 1 to %d within its budget", passes, got, most)
		}
		if boundCount() < len(claims) && (res.RequeueAfter <= 0 || res.RequeueAfter > 100*time.Millisecond) {
			t.Fatalf("pass %d stopped with %d of %d bound and asked to come back after %v, want at once", passes, boundCount(), len(claims), res.RequeueAfter)
		}
	}
	if got := boundCount(); got != len(claims) {
		t.Fatalf("%d of %d reservations bound after %d passes", got, len(claims), passes)
	}
	if passes < 3 {
		t.Fatalf("all bound in %d passes: the budget did not stop any pass", passes)
	}
	w.provider.SetClock(w.clock)
	w.rounds(20, w.launched(claims...))
	w.noFailures(t)
	if !w.launched(claims...)() {
		t.Fatal("not every NodeClaim launched")
	}
}
