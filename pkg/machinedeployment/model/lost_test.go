package model

import (
	"testing"
	"time"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
)

// Conformance run G (Utilization, MachineDeployment mode): 100 NodeClaims
// on one MachineDeployment. Cluster API's MachineSet made 101 Machines for
// 100 replicas (a create outlasted its reconcile's one-minute timeout and
// was made anyway) and removed the excess by its deletion order, Node-less
// Machines first: the one the provider had just bound to a NodeClaim. The
// NodeClaim's next Create raised a replica again; the extra Machine was bound
// to that new reservation and the Machine made for the raise, left with no
// NodeClaim, booted and ran a node until its spare replica was given back:
// 101 nodes for 100 pods, and the suite failed.
//
// A NodeClaim whose Machine someone else deleted before it launched still
// owns its replica: it reclaims that replica (no raise) and is bound to the
// Machine the MachineSet kept in its place. No Machine beyond the ones
// already made, no replica beyond one per NodeClaim.
func TestAClaimWhoseMachineTheMachineSetRemovedTakesTheMachineKeptInItsPlace(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	a, b := w.newClaim(), w.newClaim()
	w.now = w.now.Add(time.Second)
	for _, c := range []string{a, b} {
		_ = w.create(c)
	}
	if got := w.replicas("cheap"); got != 2 {
		t.Fatalf("cheap has %d replicas for two NodeClaims, want 2", got)
	}
	// The MachineSet makes its two Machines, and one more.
	w.runMachineSets()
	w.overCreate("cheap")
	w.hub.Sync()
	w.reconcile()
	lost := w.machineOf(a)
	if lost == nil || w.machineOf(b) == nil {
		t.Fatalf("NodeClaims %s and %s not both bound after the Machines were made", a, b)
	}
	// The reservations of bound claims are dropped with a later write:
	// TakeUpDelay after a pass first saw them taken up.
	w.now = w.now.Add(20 * time.Second)
	w.hub.Sync()
	w.reconcile()
	w.now = w.now.Add(machinedeployment.TakeUpDelay)
	w.reconcile()
	w.hub.Sync()
	if p, _ := hub.PendingNodeClaims(w.md("cheap")); len(p) != 0 {
		t.Fatalf("reservations %v still listed after the bound claims' cleanup", p)
	}
	// Core's Create of a waits on its Machine; the MachineSet removes the
	// excess: a's Machine (Node-less, first by name).
	_ = w.create(a)
	w.runMachineSets()
	w.hub.Sync()
	if m := w.machineOf(a); m != nil {
		t.Fatalf("the MachineSet removed %s, not NodeClaim %s's Machine %s: the scenario is not the one it describes", "another Machine", a, m.Name)
	}
	made := w.machinesMade

	w.mustLaunch(t, 20, a, b)
	w.rounds(10, func() bool { return false })
	w.noFailures(t)
	if got := w.replicas("cheap"); got != 2 {
		t.Errorf("cheap has %d replicas for two NodeClaims, want 2: NodeClaim %s raised again instead of reclaiming its replica", got, a)
	}
	if extra := w.machinesMade - made; extra != 0 {
		t.Errorf("the MachineSet made %d Machine(s) after it removed %s's; want none: the Machine it kept serves %s", extra, a, a)
	}
	if live := w.liveMachines("cheap"); live != 2 {
		t.Errorf("cheap has %d live Machines, want 2", live)
	}
	if m := w.machineOf(a); m == nil || m.Name == lost.Name {
		t.Errorf("NodeClaim %s is bound to %v, want the Machine kept in place of %s", a, m, lost.Name)
	}
}
