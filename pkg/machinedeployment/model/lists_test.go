package model

import (
	"math/rand"
	"testing"
	"time"
)

// Core calls Delete again and again until a NodeClaim's Machine is gone,
// and each call releases the Machine again: a lowering of its replica is
// owed once. Every write with a lowering listed the MachineDeployment's
// Machines from the API server, owed or not: at 1 000 nodes, hundreds of
// lists of a thousand Machines per scale-down (bench-1000 run 12: the
// provider's `machinesOf` 39.4 s of CPU, and the hub serving each). Only
// the call that lowers lists them live now.
func TestARetriedReleaseListsMachinesLiveOnlyForItsLowering(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	rng := rand.New(rand.NewSource(1))
	claim := w.newClaim()
	for i := 0; i < 100 && !w.claims[claim].launched; i++ {
		w.now = w.now.Add(time.Second)
		w.act(rng)
	}
	if !w.claims[claim].launched {
		t.Fatalf("NodeClaim %s did not launch", claim)
	}
	if r := w.replicas("cheap"); r != 1 {
		t.Fatalf("cheap has %d replicas after one launch, want 1", r)
	}
	w.startDeleting(claim)
	w.liveMachineLists.Store(0)
	const calls = 10 // the MachineSet has not removed the Machine meanwhile
	for range calls {
		if err := w.remove(claim); err != nil {
			t.Fatalf("Release of %s: %v", claim, err)
		}
	}
	if r := w.replicas("cheap"); r != 0 {
		t.Fatalf("cheap has %d replicas after the release, want 0", r)
	}
	if got := w.liveMachineLists.Load(); got != 1 {
		t.Fatalf("%d calls of Release listed Machines from the API server %d times, want once (the lowering)", calls, got)
	}
	if len(w.failures) > 0 {
		t.Fatalf("invariants broken: %v", w.failures)
	}
}
