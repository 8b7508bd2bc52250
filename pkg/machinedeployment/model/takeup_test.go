package model

import (
	"context"
	"testing"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
)

// Issue 45 (the world's work in MachineDeployment mode): a burst's Machines
// come from the MachineSet one after another, and each pass binds the ones
// made since the last. Dropping each pass's take-ups from the records in a
// write of their own cost one MachineDeployment write per node, each copied
// by Cluster API onto the MachineSet (which reconciles again). Take-ups
// that no other write carries are written together, TakeUpDelay after a
// pass first saw one; meanwhile every decision counts them done.
func TestReservationsMachinesTookUpAreDroppedTogether(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0}, nil, nil)
	w.reconcile()
	var claims []string
	for range 4 {
		claims = append(claims, w.newClaim())
	}
	w.now = w.now.Add(time.Second)
	for _, c := range claims {
		_ = w.create(c) // raised: Launch waits for a Machine
	}
	if got := w.replicas("cheap"); got != 4 {
		t.Fatalf("cheap has %d replicas for four NodeClaims, want 4", got)
	}
	w.stalled["cheap"] = true
	w.runMachineSets() // Cluster API's MachineSet, which makes no Machine yet
	sets := w.machineSetsOf(w.md("cheap"))
	if len(sets) != 1 {
		t.Fatalf("cheap has %d MachineSets, want 1", len(sets))
	}
	// Its Machines come one by one, a second apart, each bound by the
	// pass its creation starts.
	before := w.mdWrites.Load()
	for i := range claims {
		w.now = w.now.Add(time.Second)
		w.acting.Store(true)
		w.makeMachine(sets[0])
		w.acting.Store(false)
		w.hub.Sync()
		w.reconcile()
		w.hub.Sync()
		if bound := w.boundClaims(claims); bound != i+1 {
			t.Fatalf("after Machine %d: %d of the NodeClaims bound, want %d", i+1, bound, i+1)
		}
	}
	w.stalled["cheap"] = false
	if got := w.mdWrites.Load() - before; got != 0 {
		t.Errorf("the provider wrote MachineDeployment cheap %d times while binding its Machines within %s, want 0: take-ups wait to be written together", got, machinedeployment.TakeUpDelay)
	}
	if p, _ := hub.PendingNodeClaims(w.md("cheap")); len(p) == 0 {
		t.Fatalf("no reservation listed before TakeUpDelay passed: the scenario does not test the delay")
	}
	w.now = w.now.Add(machinedeployment.TakeUpDelay)
	w.reconcile()
	w.hub.Sync()
	if got := w.mdWrites.Load() - before; got != 1 {
		t.Errorf("the provider wrote MachineDeployment cheap %d times for the take-ups, want 1", got)
	}
	if p, _ := hub.PendingNodeClaims(w.md("cheap")); len(p) != 0 {
		t.Errorf("reservations %v still listed %s after their Machines took them up", p, machinedeployment.TakeUpDelay)
	}
	w.mustLaunch(t, 20, claims...)
	w.noFailures(t)
}

// boundClaims counts the claims with a bound Machine.
func (w *world) boundClaims(claims []string) int {
	n := 0
	for _, c := range claims {
		if w.machineOf(c) != nil {
			n++
		}
	}
	return n
}

// A reservation a Machine took up stays listed for up to TakeUpDelay. When
// that Machine is released in the meantime (its launch failed within
// seconds, as an exhausted offering's does: marked, the lowering not yet
// written), the NodeClaim's next Launch must not wait on the listed
// reservation, for which no Machine will be made: it reserves again at once.
func TestALaunchDoesNotWaitOnAReservationItsReleasedMachineTookUp(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0}, nil, nil)
	w.reconcile()
	a := w.newClaim()
	w.now = w.now.Add(time.Second)
	_ = w.create(a) // raised on cheap
	w.runMachineSets()
	w.hub.Sync()
	w.reconcile() // binds the Machine to a
	w.hub.Sync()
	w.reconcile() // the take-up waits for TakeUpDelay
	w.hub.Sync()
	m := w.machineOf(a)
	if m == nil {
		t.Fatal("setup: no Machine bound to the NodeClaim")
	}
	if got := w.reservations(a); len(got) != 1 {
		t.Fatalf("setup: want %s's taken-up reservation still listed, got %v", a, got)
	}
	// Released as a failed launch is, up to the lowering.
	w.acting.Store(true)
	m.Annotations[clusterv1.DeleteMachineAnnotation] = "karpenter-clusterapi: NodeClaim " + a + " failed to launch"
	w.must(w.hub.API.Update(context.Background(), m))
	w.acting.Store(false)
	w.hub.Sync()
	before := w.replicas("cheap")
	_ = w.create(a)
	if got := w.replicas("cheap"); got != before+1 {
		t.Fatalf("NodeClaim %s's Launch left cheap at %d replicas (from %d): it waited on the reservation its released Machine took up", a, got, before)
	}
	w.mustLaunch(t, 60, a)
	w.noFailures(t)
}
