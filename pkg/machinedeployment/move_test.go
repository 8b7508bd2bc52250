package machinedeployment

import (
	"testing"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// A launch moving off a MachineDeployment whose MachineSet made no Machine
// for it leaves its replica there as a free reservation, stamped as before:
// replicas and counts do not change, and no NodeClaim has its key.
func TestAMoveLeavesTheReplicaAsAFreeReservation(t *testing.T) {
	at := t0.Add(time.Minute)
	old := machine("old", t0, boundTo("A"), withNode) // made before the raise
	md := planMD(2, 2, map[string]time.Time{"B": at})
	in := &intent{kind: intentMove, claim: "B"}
	out := planned(t, md, []*clusterv1.Machine{old}, nil, in)
	if !in.done || out.replicas != 2 || out.recs.owned != 2 {
		t.Fatalf("done %v, replicas %d, owned %d: want moved, 2 and 2", in.done, out.replicas, out.recs.owned)
	}
	if _, ok := out.recs.pending["B"]; ok || len(out.recs.pending) != 1 {
		t.Fatalf("reservations %v: want B's under a moved key", out.recs.pending)
	}
	for k, got := range out.recs.pending {
		if !isMoved(k) || !got.Equal(at) {
			t.Fatalf("reservation %s at %v: want a moved key at B's stamp %v", k, got, at)
		}
	}
	// Moved twice from the same MachineDeployment: both kept apart.
	md = planMD(2, 2, map[string]time.Time{"B": at, movedPrefix + "B": t0})
	in = &intent{kind: intentMove, claim: "B"}
	if out = planned(t, md, nil, nil, in); !in.done || len(out.recs.pending) != 2 {
		t.Fatalf("second move of B: done %v, reservations %v", in.done, out.recs.pending)
	}
}

// A reservation stays where a Machine is bound to its NodeClaim (the cache,
// or this process's binding it does not show yet) or where a Machine it can
// be bound to exists: the MachineSet is not what it waits for.
func TestAReservationWithAMachineDoesNotMove(t *testing.T) {
	at := t0.Add(time.Minute)
	for name, c := range map[string]struct {
		machines []*clusterv1.Machine
		bound    bool
	}{
		"bound in the cache":           {machines: []*clusterv1.Machine{machine("m", at, boundTo("B"))}},
		"bound, the cache behind":      {bound: true},
		"an eligible Machine is there": {machines: []*clusterv1.Machine{machine("m", at.Add(time.Second))}},
	} {
		t.Run(name, func(t *testing.T) {
			md := planMD(1, 1, map[string]time.Time{"B": at})
			recs, err := readRecords(md)
			if err != nil {
				t.Fatal(err)
			}
			in := &intent{kind: intentMove, claim: "B"}
			out := plan(md, recs, view{machines: c.machines, free: func(string) bool { return false },
				bound: func(string) bool { return c.bound }}, []*intent{in})
			if in.done {
				t.Fatalf("moved: reservations %v", out.recs.pending)
			}
		})
	}
}
