package model

import (
	"strings"
	"testing"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
)

// A MachineSet that makes no Machine (stalled) holds a launch only for
// moveAfter: then it reserves on the other member (the model's choose
// takes dear as one when asked to move) and launches there, well before
// core's launch timeout. cheap keeps the replica as a free reservation and,
// once its MachineSet goes on, gives it back with the Machine made for it.
func TestALaunchMovesOffAStalledMachineSet(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.reconcile()
	w.stalled["cheap"] = true
	a := w.newClaim()
	if err := w.create(a); err == nil {
		t.Fatalf("NodeClaim %s launched without a Machine", a)
	}
	if r := w.reservations(a); len(r) != 1 || r[0] != "cheap" {
		t.Fatalf("NodeClaim %s has reservations on %v, want cheap", a, r)
	}
	w.mustLaunch(t, int(launchTimeout.Seconds())-1, a)
	w.noFailures(t)
	if m := w.machineOf(a); m == nil || !strings.HasPrefix(m.Name, "dear") {
		t.Fatalf("NodeClaim %s is bound to %v, want a Machine of dear", a, m)
	}
	pending, _ := hub.PendingNodeClaims(w.md("cheap"))
	if len(pending) != 1 || w.replicas("cheap") != 1 {
		t.Fatalf("cheap has %d replicas and reservations %v, want 1 and the moved one", w.replicas("cheap"), pending)
	}
	for k := range pending {
		if !strings.HasPrefix(k, "moved:") {
			t.Fatalf("cheap's reservation %s is not a moved one", k)
		}
	}
	w.stalled["cheap"] = false
	w.rounds(int(2*machinedeployment.OrphanGrace.Seconds()), func() bool { return w.replicas("cheap") == 0 && w.liveMachines("cheap") == 0 })
	w.noFailures(t)
	if pending, _ := hub.PendingNodeClaims(w.md("cheap")); w.replicas("cheap") != 0 || len(pending) != 0 || w.liveMachines("cheap") != 0 {
		t.Fatalf("cheap has %d replicas, reservations %v and %d Machines once its MachineSet went on: want the moved replica given back", w.replicas("cheap"), pending, w.liveMachines("cheap"))
	}
}

// With no other member that can take it (dear is at its max-size), the
// launch waits where it is, as before: core's launch timeout ends it and its
// successor takes the reservation.
func TestALaunchWithNowhereToMoveWaits(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, map[string]map[string]string{"dear": {instancetype.MaxSizeAnnotation: "0"}}, nil)
	w.reconcile()
	w.stalled["cheap"] = true
	a := w.newClaim()
	w.rounds(int(launchTimeout.Seconds())-1, w.launched(a))
	w.noFailures(t)
	if w.claims[a].launched {
		t.Fatalf("NodeClaim %s launched while cheap's MachineSet made nothing and dear is full", a)
	}
	if r := w.reservations(a); len(r) != 1 || r[0] != "cheap" {
		t.Fatalf("NodeClaim %s has reservations on %v, want cheap (nowhere to move)", a, r)
	}
	if w.replicas("dear") != 0 {
		t.Fatalf("dear raised to %d past its max-size 0", w.replicas("dear"))
	}
}
