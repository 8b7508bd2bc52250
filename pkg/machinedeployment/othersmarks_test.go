package machinedeployment

import (
	"errors"

	"testing"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// Cluster API ranks every delete-machine mark alike and breaks the tie by
// name (core/reconcilers/machineset, sortableMachines). With a user's mark
// on a-1, which sorts before the provider's k-2, a lowering by one for
// k-2's mark would remove a-1: the gate refuses it. With the user's mark on
// z-1, which sorts after, the same lowering removes k-2 and is written.
func TestTheGateCountsOthersMarksAsClusterAPIRanksThem(t *testing.T) {
	for _, tc := range []struct {
		user  string
		wrote bool
	}{{"a-1", false}, {"z-1", true}} {
		t.Run(tc.user, func(t *testing.T) {
			k := machine("k-2", t0, boundTo("K"), withNode, markedWith(releaseMark("K", "deleted")))
			machines := []*clusterv1.Machine{
				machine("b-0", t0, boundTo("A"), withNode),
				machine(tc.user, t0, withNode, markedWith("yes")),
				k,
			}
			md := planMD(3, 2, nil)
			lower := &intent{kind: intentLower, claim: "K", machine: k}
			out := planned(t, md, machines, nil, lower)
			if tc.wrote {
				if out.replicas != 2 || !lower.done {
					t.Fatalf("replicas %d done %v err %v: the lowering removes k-2 (it sorts first) and is written", out.replicas, lower.done, lower.err)
				}
				return
			}
			if out.replicas != 3 || lower.done || !errors.Is(lower.err, errMarkedFirst) {
				t.Fatalf("replicas %d done %v err %v: the lowering would remove %s, which the user marked, and must be refused", out.replicas, lower.done, lower.err, tc.user)
			}
		})
	}
}

// A user's mark that was going to be honoured anyway (someone else's
// lowering is already owed to it) does not block the provider's.
func TestAnotherMarkAlreadyOwedALoweringDoesNotBlock(t *testing.T) {
	k := machine("k-2", t0, boundTo("K"), withNode, markedWith(releaseMark("K", "deleted")))
	machines := []*clusterv1.Machine{
		machine("b-0", t0, boundTo("A"), withNode),
		machine("a-1", t0, withNode, markedWith("yes")),
		k,
	}
	// Replicas 2 with three Machines: the MachineSet removes a-1 already.
	md := planMD(2, 2, nil)
	lower := &intent{kind: intentLower, claim: "K", machine: k}
	out := planned(t, md, machines, nil, lower)
	if out.replicas != 1 || !lower.done {
		t.Fatalf("replicas %d done %v err %v: a-1 goes anyway, k-2 next: written", out.replicas, lower.done, lower.err)
	}
}
