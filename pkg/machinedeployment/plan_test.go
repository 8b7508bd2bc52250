package machinedeployment

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

var t0 = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)

func planMD(replicas, owned int32, pending map[string]time.Time, ann ...string) *clusterv1.MachineDeployment {
	md := &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "md", Annotations: map[string]string{
		OwnedReplicasAnnotation: fmt.Sprint(owned)}}, Spec: clusterv1.MachineDeploymentSpec{Replicas: ptr.To(replicas)}}
	hub.SetPendingNodeClaims(md, pending)
	for i := 0; i+1 < len(ann); i += 2 {
		md.Annotations[ann[i]] = ann[i+1]
	}
	return md
}

type machineOpt func(*clusterv1.Machine)

func boundTo(claim string) machineOpt {
	return func(m *clusterv1.Machine) { m.Annotations[v1alpha1.NodeClaimAnnotation] = claim }
}
func markedWith(v string) machineOpt {
	return func(m *clusterv1.Machine) { m.Annotations[clusterv1.DeleteMachineAnnotation] = v }
}
func withNode(m *clusterv1.Machine) {
	m.Status.NodeRef = clusterv1.MachineNodeReference{Name: "node-" + m.Name}
}
func deleting(m *clusterv1.Machine) { now := metav1.NewTime(t0); m.DeletionTimestamp = &now }

func machine(name string, created time.Time, opts ...machineOpt) *clusterv1.Machine {
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name),
		CreationTimestamp: metav1.NewTime(created), Annotations: map[string]string{}, Labels: map[string]string{}}}
	for _, o := range opts {
		o(m)
	}
	return m
}

func planned(t *testing.T, md *clusterv1.MachineDeployment, machines []*clusterv1.Machine, free map[string]bool, intents ...*intent) outcome {
	t.Helper()
	recs, err := readRecords(md)
	if err != nil {
		t.Fatal(err)
	}
	return plan(md, recs, view{machines: machines, free: func(c string) bool { return free[c] }}, intents)
}

// The review's critical path: NodeClaim A runs on the MachineDeployment's
// one Machine; B's replica is still up for B, which went before its
// Machine was made; someone lowered spec.replicas from 2 to 1. Nothing the
// provider writes may lower it further: the MachineSet would remove A's
// running Machine. The old design gave B's replica back (replicas 0).
func TestNoWriteLowersReplicasWithoutAMarkEvenDuringADeficit(t *testing.T) {
	a := machine("a", t0, boundTo("A"), withNode)
	md := planMD(1, 2, map[string]time.Time{"B": t0.Add(time.Second)})
	out := planned(t, md, []*clusterv1.Machine{a}, map[string]bool{"B": true},
		&intent{kind: intentGiveBack, claim: "B", machine: a}, // not made for B: refused
		&intent{kind: intentLower, claim: "A", machine: machine("ghost", t0)})
	if out.replicas != 1 {
		t.Fatalf("replicas %d, want 1: a lowering without a Machine of its own", out.replicas)
	}
	if len(out.recs.pending) != 0 || out.recs.owned != 1 {
		t.Fatalf("owned %d pending %v: B's reservation, which no replica backs, is dropped and owned follows the replicas", out.recs.owned, out.recs.pending)
	}
}

// A lowering is covered by the provider's marks, once: the MachineSet
// removes marked Machines first, and a second lowering for the same mark
// would make it pick an unmarked one.
func TestALoweringIsCoveredByAMarkOnce(t *testing.T) {
	machines := []*clusterv1.Machine{
		machine("a", t0, boundTo("A"), withNode),
		machine("b", t0, boundTo("B"), withNode),
		machine("c", t0, boundTo("C"), withNode, markedWith(releaseMark("C", "deleted"))),
	}
	md := planMD(3, 3, nil)
	lower := &intent{kind: intentLower, claim: "C", machine: machines[2]}
	out := planned(t, md, machines, nil, lower)
	if out.replicas != 2 || out.recs.owned != 2 || !lower.done {
		t.Fatalf("replicas %d owned %d done %v: want 2, 2, done", out.replicas, out.recs.owned, lower.done)
	}
	// The retry after the write (the MachineSet has not removed c yet).
	md = planMD(2, 2, nil)
	again := &intent{kind: intentLower, claim: "C", machine: machines[2]}
	out = planned(t, md, machines, nil, again)
	if out.replicas != 2 || again.done {
		t.Fatalf("a retried release lowered again: replicas %d", out.replicas)
	}
	// A replica the count says is owed, with no mark left to cover it (c
	// is gone, someone else's Machine u stands): the gate alone refuses.
	u := machine("u", t0, withNode)
	md = planMD(3, 3, nil)
	forced := &intent{kind: intentLower, claim: "C", machine: machines[2]}
	out = planned(t, md, []*clusterv1.Machine{machines[0], machines[1], u}, nil, forced)
	if out.replicas != 3 || !isNotCovered(forced.err) {
		t.Fatalf("replicas %d err %v: want 3 and the gate's refusal", out.replicas, forced.err)
	}
}

// A Machine the MachineSet has not made yet counts: the gate reads
// max(Machines, replicas), so a lowering decided before the MachineSet
// makes the Machine for the current replicas removes no unmarked one.
func TestTheGateCountsMachinesNotMadeYet(t *testing.T) {
	machines := []*clusterv1.Machine{machine("a", t0, boundTo("A"), withNode)}
	md := planMD(3, 3, map[string]time.Time{"B": t0, "C": t0})
	forced := &intent{kind: intentGiveBack, claim: "C", machine: machine("ghost", t0.Add(time.Second))}
	out := planned(t, md, machines, map[string]bool{"C": true}, forced)
	// ghost is counted as marked (the caller says it marked it) but is not
	// among the Machines: the MachineSet may make B's and C's Machines
	// before it sees the write, and then remove one unmarked.
	if out.replicas != 3 {
		t.Fatalf("replicas %d: lowered without a Machine of the MachineDeployment marked", out.replicas)
	}
}

func TestReserveTakesAFreeReservationBeforeRaisingAndStopsAtMaxSize(t *testing.T) {
	md := planMD(2, 2, map[string]time.Time{"gone": t0, "live": t0}, instancetype.MaxSizeAnnotation, "3")
	take := &intent{kind: intentReserve, claim: "next"}
	raise := &intent{kind: intentReserve, claim: "new"}
	refused := &intent{kind: intentReserve, claim: "newer"}
	out := planned(t, md, nil, map[string]bool{"gone": true}, take, raise, refused)
	if take.took != "gone" || !out.recs.pending["next"].Equal(t0) {
		t.Fatalf("took %q, stamp %v: want gone's reservation with its stamp", take.took, out.recs.pending["next"])
	}
	if !raise.raised || out.replicas != 3 || out.recs.owned != 3 {
		t.Fatalf("raise: %v, replicas %d owned %d", raise.raised, out.replicas, out.recs.owned)
	}
	if refused.err == nil || out.replicas != 3 {
		t.Fatalf("past max-size: err %v replicas %d", refused.err, out.replicas)
	}
}

func TestMalformedSizesAndRecordsRefuseAndNameTheAnnotation(t *testing.T) {
	md := planMD(1, 1, nil, instancetype.MinSizeAnnotation, "one")
	in := &intent{kind: intentReserve, claim: "x"}
	out := planned(t, md, nil, nil, in)
	if in.err == nil || out.replicas != 1 || !strings.Contains(in.err.Error(), instancetype.MinSizeAnnotation) {
		t.Fatalf("malformed min-size: err %v, replicas %d", in.err, out.replicas)
	}
	bad := planMD(1, 1, nil, PendingAnnotation, "{")
	if _, err := readRecords(bad); err == nil || !strings.Contains(err.Error(), PendingAnnotation) || !strings.Contains(err.Error(), "ns/md") {
		t.Fatalf("malformed reservations: %v", err)
	}
}

func TestAReleaseAtMinSizeLeavesTheReplicaToWhoeverSetIt(t *testing.T) {
	c := machine("c", t0, boundTo("C"), withNode, markedWith(releaseMark("C", "deleted")))
	md := planMD(2, 1, nil, instancetype.MinSizeAnnotation, "2")
	in := &intent{kind: intentLower, claim: "C", machine: c}
	out := planned(t, md, []*clusterv1.Machine{machine("u", t0.Add(-time.Hour), withNode), c}, nil, in)
	if out.replicas != 2 || out.recs.owned != 0 || !in.atMin {
		t.Fatalf("replicas %d owned %d atMin %v", out.replicas, out.recs.owned, in.atMin)
	}
}

// A bound Machine someone else deletes leaves its replica to its NodeClaim
// (stamped at the deletion: the MachineSet's replacement is made for it),
// but only while the replica is Karpenter's.
func TestReclaimOnlyWhileTheReplicaIsSpare(t *testing.T) {
	gone := machine("a", t0, boundTo("A"), deleting)
	in := &intent{kind: intentReclaim, claim: "A", at: t0.Add(5 * time.Second)}
	out := planned(t, planMD(1, 1, nil), []*clusterv1.Machine{gone}, nil, in)
	if !in.done || !out.recs.pending["A"].Equal(t0.Add(5*time.Second)) {
		t.Fatalf("reclaim: done %v pending %v", in.done, out.recs.pending)
	}
	// Someone lowered the replicas to 0 and the MachineSet removes A's
	// Machine for it: the replica is theirs, nothing to reclaim.
	in = &intent{kind: intentReclaim, claim: "A", at: t0.Add(5 * time.Second)}
	out = planned(t, planMD(0, 1, nil), []*clusterv1.Machine{gone}, nil, in)
	if in.done || len(out.recs.pending) != 0 || out.recs.owned != 0 {
		t.Fatalf("reclaim after a lowering: done %v pending %v owned %d", in.done, out.recs.pending, out.recs.owned)
	}
}

// A reservation whose Machine will never come (the MachineSet settled with
// no Machine made since the raise) is handed over; one whose Machine may
// still come is not.
func TestStrandedReservationsAreHandedOverOnlyOnceSettled(t *testing.T) {
	u := machine("u", t0.Add(-time.Hour), withNode)
	in := &intent{kind: intentStranded, claim: "A"}
	out := planned(t, planMD(1, 1, map[string]time.Time{"A": t0}), []*clusterv1.Machine{u}, nil, in)
	if !in.done || out.recs.owned != 0 || out.replicas != 1 {
		t.Fatalf("stranded: done %v owned %d replicas %d", in.done, out.recs.owned, out.replicas)
	}
	in = &intent{kind: intentStranded, claim: "A"}
	_ = planned(t, planMD(2, 1, map[string]time.Time{"A": t0}), []*clusterv1.Machine{u}, nil, in)
	if in.done {
		t.Fatal("handed over while the MachineSet may still make its Machine")
	}
	fresh := machine("f", t0.Add(time.Second))
	in = &intent{kind: intentStranded, claim: "A"}
	_ = planned(t, planMD(2, 1, map[string]time.Time{"A": t0}), []*clusterv1.Machine{u, fresh}, nil, in)
	if in.done {
		t.Fatal("handed over with a Machine made for it")
	}
}

// An older version's records are read and dropped: held replicas become
// reservations, released Machines are derived.
func TestAnOlderVersionsRecordsAreMerged(t *testing.T) {
	md := planMD(3, 3, map[string]time.Time{"A": t0},
		HeldReplicasAnnotation, `{"gone":{"raised":"2026-11-28T11:00:00Z","held":"2026-11-28T11:30:00Z"}}`,
		hub.ReleasedMachinesAnnotation, `["m1"]`)
	out := planned(t, md, nil, nil)
	if !out.changed || len(out.recs.pending) != 2 || !out.recs.pending["gone"].Equal(time.Date(2026, 11, 28, 11, 0, 0, 0, time.UTC)) {
		t.Fatalf("changed %v pending %v", out.changed, out.recs.pending)
	}
	written := md.DeepCopy()
	out.recs.apply(written)
	if _, ok := written.Annotations[HeldReplicasAnnotation]; ok {
		t.Fatal("held-replicas kept")
	}
	if _, ok := written.Annotations[hub.ReleasedMachinesAnnotation]; ok {
		t.Fatal("released-machines kept")
	}
}

// A write of a burst's reservations asks whether each reservation's
// NodeClaim is gone once, not once per intent: at 1 000 NodeClaims the
// question (a NodeClaim read) asked for every reservation by every
// reservation of a batch was most of the provider's own CPU (bench-1000).
func TestABatchAsksAboutEachNodeClaimOnce(t *testing.T) {
	pending := map[string]time.Time{}
	for i := 0; i < 300; i++ {
		pending[fmt.Sprintf("open-%d", i)] = t0
	}
	md := planMD(300, 300, pending)
	recs, err := readRecords(md)
	if err != nil {
		t.Fatal(err)
	}
	asked := map[string]int{}
	free := func(c string) bool { asked[c]++; return false }
	var intents []*intent
	for i := 0; i < 100; i++ {
		intents = append(intents, &intent{kind: intentReserve, claim: fmt.Sprintf("new-%d", i)})
	}
	out := plan(md, recs, view{free: free}, intents)
	if out.replicas != 400 {
		t.Fatalf("replicas %d, want 400 (100 raises, no free reservation to take)", out.replicas)
	}
	for c, n := range asked {
		if n > 1 {
			t.Fatalf("asked %d times whether NodeClaim %s is gone in one write, want once", n, c)
		}
	}
}
