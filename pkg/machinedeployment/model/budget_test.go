package model

import (
	"context"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
)

// A pass over a MachineDeployment holds its lock, and every raise of
// Launch waits for that lock. At 1 000 Machines one pass bound or marked
// hundreds of Machines in one go and held the raises of a burst for tens of
// seconds (bench-1000). A pass now stops starting writes to Machines once
// it has held the lock for its budget and comes back at once for the rest.
// Its bindings go in rounds of BindRound at once: on a hub that answers a
// patch in one to two seconds, one binding at a time was one per pass,
// about 30 a minute, and at 1 000 nodes core deleted NodeClaims at its
// launch timeout while their Machines waited to be bound. Here a clock
// that moves 5 s each time the provider reads it puts every pass over its
// budget after its first round: 2 x BindRound + 4 reservations are bound
// in three passes, each a whole round, none lost. The budget starts at the
// first write, so a pass whose reads alone outlast it (live reads of
// NodeClaims that are gone, at 1 000 under load) still binds a round.
func TestAPassBindsARoundAtOnceAndStopsAtItsBudget(t *testing.T) {
	bindsOverPasses(t, 5*time.Second, 2*machinedeployment.BindRound+4)
}

// bindsOverPasses makes n reservations and their Machines and runs passes
// with a clock that moves by tick each time the provider reads it, until
// all are bound; each pass must bind one round: BindRound, or what is left.
func bindsOverPasses(t *testing.T, tick time.Duration, n int) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.stalled["cheap"] = true
	var claims []string
	for i := 0; i < n; i++ {
		c := w.newClaim()
		_ = w.create(c)
		claims = append(claims, c)
	}
	if got := w.replicas("cheap"); got != int32(n) {
		t.Fatalf("cheap has %d replicas, want %d", got, n)
	}
	w.stalled["cheap"] = false
	w.runMachineSets()
	if got := w.liveMachines("cheap"); got != n {
		t.Fatalf("cheap has %d Machines, want %d", got, n)
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

	// The provider's own clock: a round's bindings read it at once, and
	// the hub's store reads the world's.
	var mu sync.Mutex
	at := w.now
	w.provider.SetClock(func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		at = at.Add(tick)
		return at
	})
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "cheap"}}
	passes := 0
	for boundCount() < len(claims) && passes < 20 {
		before := boundCount()
		res, err := w.controller.Reconcile(context.Background(), req)
		if err != nil {
			t.Fatalf("pass %d: %v", passes, err)
		}
		passes++
		if got, want := boundCount()-before, min(machinedeployment.BindRound, len(claims)-before); got != want {
			t.Fatalf("pass %d bound %d Machines, want %d: one round within its budget", passes, got, want)
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
	w.now = at
	w.provider.SetClock(w.clock)
	w.rounds(20, w.launched(claims...))
	w.noFailures(t)
	if !w.launched(claims...)() {
		t.Fatal("not every NodeClaim launched")
	}
}
