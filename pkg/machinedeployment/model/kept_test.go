package model

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
)

// reserve starts core's Create of a NodeClaim in the background and
// returns once the NodeClaim holds a reservation on cheap (raised, or taken
// over from a NodeClaim that is gone), with the channel Launch's answer
// comes on. The Launch ends with ctx at the latest.
func (w *world) reserve(t *testing.T, ctx context.Context, claim string) <-chan error {
	t.Helper()
	c := w.claims[claim]
	returned := make(chan error, 1)
	go func() {
		_, err := w.provider.Launch(ctx, claim, c.chosen, func(md types.NamespacedName) { c.chosen = &md }, w.choose)
		returned <- err
	}()
	waitFor(t, "a reservation for "+claim, func() bool {
		pending, _ := hub.PendingNodeClaims(w.md("cheap"))
		_, ok := pending[claim]
		return ok
	}, returned)
	return returned
}

// bench-1000 at bad37d8 (2026-11-29): while the MachineSet was still
// making the Machines of a 1 000-replica burst, the provider gave free
// replicas back with Machines it had just made; the MachineSet, short of
// its replicas, kept them. Once it settled, the provider took its marks
// off instead of deleting them, and those Machines, made before the raises
// still waiting for a Machine, could serve none of them: the raises were
// handed over as stranded and raised again. 19 booted Machines stayed,
// their replicas counted as someone else's, after the burst went back to
// zero. A Machine given back that the MachineSet keeps is deleted, as a
// released one is (the design's Kept rule): the MachineSet makes the
// waiting raise its Machine.
func TestAGivenBackMachineTheMachineSetKeepsIsDeletedNotLeftToOthers(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	never := make(chan time.Time)
	w.provider.SetLaunchTimer(func(time.Duration) <-chan time.Time { return never })
	w.reconcile()
	w.stalled["cheap"] = true // the MachineSet is behind its replicas

	// Two raises; core's launch timeout deletes one NodeClaim outright and
	// the other is still terminating.
	a, b := w.newClaim(), w.newClaim()
	w.reserve(t, ctx, a)
	w.reserve(t, ctx, b)
	w.now = w.now.Add(launchTimeout)
	w.timeOut(a)
	w.startDeleting(b)
	w.hub.Sync()
	w.reconcile()
	w.now = w.now.Add(machinedeployment.OrphanGrace + time.Second)

	// The MachineSet makes one Machine of two; a's free replica is given
	// back with it, and the MachineSet, short of its replicas, keeps it.
	w.overCreate("cheap")
	kept := w.machines()[0].Name
	w.hub.Sync()
	w.reconcile()
	w.hub.Sync()
	if got := w.replicas("cheap"); got != 1 {
		t.Fatalf("cheap has %d replicas after a's replica was given back, want 1", got)
	}
	w.runMachineSets()
	if live := w.liveMachines("cheap"); live != 1 {
		t.Fatalf("%d live Machines after the give-back, want 1: the MachineSet keeps %s", live, kept)
	}

	// A new NodeClaim raises (b still holds its replica), b goes, and its
	// successor takes b's replica.
	w.now = w.now.Add(5 * time.Second)
	d := w.newClaim()
	w.reserve(t, ctx, d)
	w.timeOut(b)
	w.hub.Sync()
	c := w.newClaim()
	w.reserve(t, ctx, c)

	// The MachineSet catches up; everything settles.
	w.stalled["cheap"] = false
	for i := 0; i < 40; i++ {
		w.runMachineSets()
		w.runInfrastructure()
		w.hub.Sync()
		w.reconcile()
		w.now = w.now.Add(5 * time.Second)
	}
	w.noFailures(t)
	md := w.md("cheap")
	n, _ := owned(md)
	var unbound []string
	for _, m := range w.mdMachines("cheap") {
		if m.DeletionTimestamp.IsZero() && bound(&m) == "" {
			unbound = append(unbound, m.Name)
		}
	}
	if len(unbound) > 0 || w.replicas("cheap") != n {
		t.Errorf("cheap settled with %d replicas, %d of them Karpenter's, and unbound Machines %v (kept: %s): nobody else raised, want every replica Karpenter's and every Machine bound",
			w.replicas("cheap"), n, unbound, kept)
	}
	for _, claim := range []string{c, d} {
		if w.machineOf(claim) == nil {
			t.Errorf("NodeClaim %s has no Machine", claim)
		}
	}
}
