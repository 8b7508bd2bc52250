package model

import (
	"testing"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
)

// Held replicas (docs/design/machinedeployment-binding.md, "Held
// replicas"), found by make bench-1000: Karpenter core deletes a NodeClaim
// whose launch outlasts its launch timeout; when its MachineSet had not made
// the Machine yet, giving the replica back made the MachineSet undo its
// work, and the next NodeClaim's raise redo it, over and over.

// timedOutBeforeItsMachine raises a replica for a new NodeClaim on "cheap"
// while its MachineSet makes no Machines, lets core's launch timeout delete
// the NodeClaim, and lets the provider find it gone. It returns the claim.
func (w *world) timedOutBeforeItsMachine(t *testing.T) string {
	t.Helper()
	w.reconcile() // the provider has counted its (no) replicas
	w.stalled["cheap"] = true
	before := w.replicas("cheap")
	a := w.newClaim()
	if err := w.create(a); err == nil {
		t.Fatalf("NodeClaim %s launched without a Machine", a)
	}
	if got := w.replicas("cheap"); got != before+1 {
		t.Fatalf("cheap has %d replicas after the raise for %s, want %d", got, a, before+1)
	}
	w.now = w.now.Add(launchTimeout)
	w.timeOut(a)
	w.now = w.now.Add(machinedeployment.OrphanGrace)
	w.hub.Sync()
	w.reconcile()
	w.noFailures(t)
	return a
}

// The next NodeClaim takes the held replica instead of raising another, and
// is bound to the Machine the MachineSet made for the first raise: one
// Machine made in all, replicas never lowered and raised again.
func TestANodeClaimTimedOutBeforeItsMachineLeavesItsReplicaToTheNext(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	a := w.timedOutBeforeItsMachine(t)
	if got := w.replicas("cheap"); got != 1 {
		t.Fatalf("cheap has %d replicas once NodeClaim %s is gone, want 1: the replica is held, not given back", got, a)
	}
	if h := w.held(w.md("cheap")); len(h) != 1 {
		t.Fatalf("cheap holds %v, want the replica of %s", h, a)
	}
	// The MachineSet gets to it: the Machine made for a's raise.
	w.stalled["cheap"] = false
	w.runMachineSets()
	first := w.machines()
	if len(first) != 1 {
		t.Fatalf("want the one Machine made for the held replica, got %d", len(first))
	}
	w.now = w.now.Add(5 * time.Second)
	b := w.newClaim()
	_ = w.create(b)
	if got := w.replicas("cheap"); got != 1 {
		t.Fatalf("cheap has %d replicas once NodeClaim %s reserved: it took the held replica, want 1", got, b)
	}
	w.mustLaunch(t, 20, b)
	w.noFailures(t)
	if m := w.machineOf(b); m == nil || m.Name != first[0].Name {
		t.Errorf("NodeClaim %s is bound to %v, want Machine %s made for the held replica", b, m, first[0].Name)
	}
	if ms := w.machines(); len(ms) != 1 {
		t.Errorf("%d Machines, want 1: the held replica's Machine was undone and made again", len(ms))
	}
	md := w.md("cheap")
	if n, _ := owned(md); n != 1 || len(w.held(md)) != 0 {
		t.Errorf("cheap owns %d replicas and holds %v, want 1 (b's) and none", n, w.held(md))
	}
}

// A held replica no NodeClaim takes is given back OrphanGrace after it was
// held, with the Machine made for it (marked, so the MachineSet removes that
// one and not another).
func TestAHeldReplicaNoNodeClaimTakesIsGivenBack(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.timedOutBeforeItsMachine(t)
	w.stalled["cheap"] = false
	w.runMachineSets()
	if ms := w.machines(); len(ms) != 1 {
		t.Fatalf("want the one Machine made for the held replica, got %d", len(ms))
	}
	w.hub.Sync()
	w.rounds(int(machinedeployment.OrphanGrace/time.Second)+10, func() bool { return w.replicas("cheap") == 0 && w.liveMachines("cheap") == 0 })
	w.noFailures(t)
	md := w.md("cheap")
	n, _ := owned(md)
	if r, live := w.replicas("cheap"), w.liveMachines("cheap"); r != 0 || live != 0 || n != 0 || len(w.held(md)) != 0 {
		t.Errorf("cheap has %d replicas, %d live Machines, owns %d, holds %v: want the held replica given back with its Machine", r, live, n, w.held(md))
	}
}

// Someone else's replicas stay untouched by a held replica given back: the
// owner's Machines with Nodes are not the one marked.
func TestAHeldReplicaIsGivenBackWithItsOwnMachine(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 2, "dear": 0}, nil, nil)
	w.timedOutBeforeItsMachine(t)
	w.stalled["cheap"] = false
	w.runMachineSets()
	w.hub.Sync()
	w.rounds(int(machinedeployment.OrphanGrace/time.Second)+10, func() bool { return w.replicas("cheap") == 2 && w.liveMachines("cheap") == 2 })
	w.noFailures(t)
	w.ownersMachinesUntouched(t)
	for _, m := range w.machines() {
		if m.Labels[clusterv1.MachineDeploymentNameLabel] == "cheap" && m.DeletionTimestamp.IsZero() && !w.userOwned[m.Name] {
			t.Errorf("Machine %s made for the held replica is still live", m.Name)
		}
	}
}

// Found by make bench-1000 (187 give-backs of held replicas decided in a
// minute, 4 of them real): a held replica may be taken by any Launch, and
// a cache that lags still shows it held. The give-back is decided on a live
// read, so the Machine made for the replica is not marked while the
// NodeClaim that took it waits for it.
func TestAHeldReplicaTakenWhileTheCacheLagsIsNotGivenBack(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.timedOutBeforeItsMachine(t)
	w.stalled["cheap"] = false
	w.runMachineSets()
	made := w.machines()
	if len(made) != 1 {
		t.Fatalf("want the one Machine made for the held replica, got %d", len(made))
	}
	w.hub.Sync()
	w.hub.SetLag(true)
	b := w.newClaim()
	_ = w.create(b) // takes the held replica; the cache does not show it
	w.now = w.now.Add(machinedeployment.OrphanGrace + time.Second)
	w.reconcile()
	w.noFailures(t)
	for _, m := range w.machines() {
		if m.Name == made[0].Name && marked(&m) {
			t.Fatalf("Machine %s, made for the replica NodeClaim %s took, was marked %q: a give-back decided on the lagging cache", m.Name, b, m.Annotations[clusterv1.DeleteMachineAnnotation])
		}
	}
	w.hub.SetLag(false)
	w.mustLaunch(t, 20, b)
	w.noFailures(t)
	if m := w.machineOf(b); m == nil || m.Name != made[0].Name {
		t.Errorf("NodeClaim %s is bound to %v, want Machine %s", b, m, made[0].Name)
	}
	if got := w.replicas("cheap"); got != 1 {
		t.Errorf("cheap has %d replicas, want 1 (b's)", got)
	}
}

// Found by make bench-1000: after a mass launch timeout, Karpenter took
// more than OrphanGrace to plan the successors of hundreds of NodeClaims,
// and their held replicas were given back while the MachineSet was still
// making the Machines for them. A held replica waits while its MachineSet
// has fewer Machines than replicas.
func TestAHeldReplicaWaitsWhileItsMachineSetStillMakesMachines(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.timedOutBeforeItsMachine(t)
	for range 4 { // two minutes of a MachineSet that makes nothing
		w.now = w.now.Add(machinedeployment.OrphanGrace)
		w.hub.Sync()
		w.reconcile()
	}
	w.noFailures(t)
	if got, h := w.replicas("cheap"), w.held(w.md("cheap")); got != 1 || len(h) != 1 {
		t.Fatalf("cheap has %d replicas and holds %v while its MachineSet has made nothing: want the replica still held", got, h)
	}
	w.stalled["cheap"] = false
	w.runMachineSets()
	b := w.newClaim()
	w.mustLaunch(t, 20, b)
	w.noFailures(t)
	if n := len(w.machines()); n != 1 || w.replicas("cheap") != 1 {
		t.Errorf("%d Machines and %d replicas, want 1 and 1: the successor took the held replica", n, w.replicas("cheap"))
	}
}

// The successor of a NodeClaim that timed out reserves before the
// provider's controller has held the gone claim's replica (found by make
// bench-1000: 1 054 replicas and Machines for 1 000 NodeClaims). It takes
// the gone claim's reservation over in its reserving write: no raise, and
// the Machine made for the first raise is the successor's.
func TestASuccessorReservingBeforeTheHoldTakesTheGoneClaimsReplica(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	// cheap is the one member of its offering (dear is dearer): the
	// successor waits there. (The model's choose takes dear as another
	// member when asked to move; TestALaunchMovesOffAStalledMachineSet.)
	w.provider.MoveAfter = time.Hour
	w.reconcile()
	w.stalled["cheap"] = true
	a := w.newClaim()
	if err := w.create(a); err == nil {
		t.Fatalf("NodeClaim %s launched without a Machine", a)
	}
	w.now = w.now.Add(launchTimeout)
	w.hub.Sync()
	w.timeOut(a)
	b := w.newClaim() // core's successor, launched before any pass of the controller
	_ = w.create(b)
	if got := w.replicas("cheap"); got != 1 {
		t.Fatalf("cheap has %d replicas once %s (the successor of %s) reserved, want 1: it takes the gone claim's reservation", got, b, a)
	}
	if r := w.reservations(b); len(r) != 1 || r[0] != "cheap" {
		t.Fatalf("NodeClaim %s has reservations on %v, want cheap", b, r)
	}
	if r := w.reservations(a); len(r) != 0 {
		t.Fatalf("gone NodeClaim %s still has reservations on %v", a, r)
	}
	w.stalled["cheap"] = false
	w.mustLaunch(t, 20, b)
	w.noFailures(t)
	if ms := w.machines(); len(ms) != 1 {
		t.Errorf("%d Machines, want 1: one Machine for one NodeClaim", len(ms))
	}
	md := w.md("cheap")
	if n, _ := owned(md); n != 1 || len(w.held(md)) != 0 {
		t.Errorf("cheap owns %d replicas and holds %v, want 1 (b's) and none", n, w.held(md))
	}
}

// boundBeforeItLaunched raises for a new NodeClaim on "cheap", lets the
// MachineSet make its Machine and the provider bind it, but the
// infrastructure gives no instance ID; then core's launch timeout deletes
// the NodeClaim. It returns the claim and its Machine.
func (w *world) boundBeforeItLaunched(t *testing.T) (string, string) {
	t.Helper()
	w.reconcile()
	a := w.newClaim()
	if err := w.create(a); err == nil {
		t.Fatalf("NodeClaim %s launched without a Machine", a)
	}
	w.runMachineSets()
	m := w.bindNow(t, a)
	w.now = w.now.Add(launchTimeout)
	w.timeOut(a)
	return a, m.Name
}

// A NodeClaim whose Machine was bound but had no instance ID within core's
// launch timeout (make bench-1000: 36 of them): its successor adopts the
// Machine, already booting, instead of raising a replica for a second one

// With no successor, the Machine is released as before, adoptGrace later.
func TestAMachineNoSuccessorAdoptsIsReleased(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	_, machine := w.boundBeforeItLaunched(t)
	w.rounds(60, func() bool { return len(w.machines()) == 0 })
	w.noFailures(t)
	if ms := w.machines(); len(ms) != 0 {
		t.Fatalf("Machine %s not released with no NodeClaim to adopt it: %d Machines left", machine, len(ms))
	}
	if got := w.replicas("cheap"); got != 0 {
		t.Errorf("cheap has %d replicas, want 0", got)
	}
}

// bindNow lets the provider's controller see the Machines made so far and
// bind them, and returns the Machine bound to claim (the test fails
// without one).
func (w *world) bindNow(t *testing.T, claim string) *clusterv1.Machine {
	t.Helper()
	w.hub.Sync()
	w.reconcile()
	w.hub.Sync()
	m := w.machineOf(claim)
	if m == nil {
		t.Fatalf("no Machine bound to %s", claim)
	}
	return m
}
