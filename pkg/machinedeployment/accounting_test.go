package machinedeployment

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
)

func mdWith(replicas int32, owned string) *clusterv1.MachineDeployment {
	md := &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "md", Annotations: map[string]string{}}}
	md.Spec.Replicas = &replicas
	if owned != "" {
		md.Annotations[OwnedReplicasAnnotation] = owned
	}
	return md
}

func apply(t *testing.T, md *clusterv1.MachineDeployment, ops ...*op) bool {
	t.Helper()
	changed, err := applyOps(md, ops, nil)
	if err != nil {
		t.Fatal(err)
	}
	return changed
}

func owned(t *testing.T, md *clusterv1.MachineDeployment) int32 {
	t.Helper()
	n, ok, err := ownedReplicas(md)
	if err != nil || !ok {
		t.Fatalf("owned replicas: %d %v %v", n, ok, err)
	}
	return n
}

// Every op that changes Karpenter's replicas changes the owned count with
// them; someone else's replicas (spec.replicas minus owned) never move.
func TestOwnedReplicasFollowKarpentersOps(t *testing.T) {
	md := mdWith(3, "") // 3 replicas of someone else, no count yet
	apply(t, md, &op{kind: opReserve, name: "a", since: time.Now()})
	if _, ok, _ := ownedReplicas(md); ok {
		t.Fatal("a count appeared before the controller set it")
	}
	// The controller counts: 0 bound Machines + 1 pending.
	apply(t, md, &op{kind: opSetOwned, bound: 0, expect: -1})
	if owned(t, md) != 1 || *md.Spec.Replicas != 4 {
		t.Fatalf("owned %d replicas %d, want 1 and 4", owned(t, md), *md.Spec.Replicas)
	}
	// A second initialisation does nothing.
	if apply(t, md, &op{kind: opSetOwned, bound: 7, expect: -1}) {
		t.Fatal("opSetOwned(-1) applied over an existing count")
	}
	apply(t, md, &op{kind: opReserve, name: "b", since: time.Now()}, &op{kind: opReserve, name: "b", since: time.Now()})
	apply(t, md, &op{kind: opBound, name: "a"}, &op{kind: opRelease, name: "m-a"}, &op{kind: opRelease, name: "m-a"})
	apply(t, md, &op{kind: opGiveBack, name: "b"}, &op{kind: opGiveBack, name: "b"})
	if owned(t, md) != 0 || *md.Spec.Replicas != 3 {
		t.Fatalf("owned %d replicas %d, want 0 and 3", owned(t, md), *md.Spec.Replicas)
	}
}

// A spare replica is given back or forgiven once, however often the
// decision is retried on a stale read.
func TestSpareAndForgiveApplyOnlyToTheCountTheyWereDecidedOn(t *testing.T) {
	md := mdWith(5, "3")
	apply(t, md, &op{kind: opSpare, expect: 3})
	if apply(t, md, &op{kind: opSpare, expect: 3}) {
		t.Fatal("a retried opSpare applied twice")
	}
	if owned(t, md) != 2 || *md.Spec.Replicas != 4 {
		t.Fatalf("owned %d replicas %d, want 2 and 4", owned(t, md), *md.Spec.Replicas)
	}
	apply(t, md, &op{kind: opForgive, expect: 2}, &op{kind: opForgive, expect: 2})
	if owned(t, md) != 1 || *md.Spec.Replicas != 4 {
		t.Fatalf("owned %d replicas %d, want 1 and 4 (forgive leaves replicas)", owned(t, md), *md.Spec.Replicas)
	}
	// Counting again applies only to the count it was decided on.
	if apply(t, md, &op{kind: opSetOwned, bound: 4, expect: 3}) {
		t.Fatal("opSetOwned applied to another count")
	}
	apply(t, md, &op{kind: opSetOwned, bound: 4, expect: 1})
	if owned(t, md) != 4 {
		t.Fatalf("owned %d, want 4", owned(t, md))
	}
	// A malformed count reads as none and is set again.
	md.Annotations[OwnedReplicasAnnotation] = "lots"
	apply(t, md, &op{kind: opSetOwned, bound: 2, expect: -1})
	if owned(t, md) != 2 {
		t.Fatalf("owned %d, want 2", owned(t, md))
	}
}

func machineAt(name string, created time.Time, bound, marked string, node bool, ms string) clusterv1.Machine {
	ctrl := true
	m := clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created), Annotations: map[string]string{},
		OwnerReferences: []metav1.OwnerReference{{Kind: "MachineSet", Name: ms, Controller: &ctrl}}}}
	if bound != "" {
		m.Annotations[v1alpha1.NodeClaimAnnotation] = bound
	}
	if marked != "" {
		m.Annotations[clusterv1.DeleteMachineAnnotation] = marked
	}
	if node {
		m.Status.NodeRef = clusterv1.MachineNodeReference{Name: name}
	}
	return m
}

// Victims: Machines this provider marked already, then outdated ones, then
// those without a Node, then the newest; never bound, deleting or marked
// by someone else.
func TestMeasureCountsBoundAndOrdersVictims(t *testing.T) {
	t0 := time.Now().Add(-time.Hour)
	deleting := machineAt("deleting", t0, "", "", true, "new")
	deleting.DeletionTimestamp = &metav1.Time{Time: t0}
	machines := []clusterv1.Machine{
		machineAt("bound", t0, "claim-a", "", true, "new"),
		machineAt("released", t0, "claim-b", "x", true, "new"),
		deleting,
		machineAt("theirs-marked", t0, "", "2024-01-01", true, "new"),
		machineAt("old-node", t0.Add(time.Minute), "", "", true, "new"),
		machineAt("new-node", t0.Add(2*time.Minute), "", "", true, "new"),
		machineAt("no-node", t0, "", "", false, "new"),
		machineAt("outdated", t0, "", "", true, "old"),
		machineAt("ours", t0, "", spareMark, true, "new"),
		machineAt("binding", t0.Add(3*time.Minute), "", "", false, "new"),
	}
	machines = append(machines, machineAt("bound-pending", t0, "claim-c", "", true, "new"))
	pending := map[string]time.Time{"claim-c": t0}
	binding := func(m *clusterv1.Machine) bool { return m.Name == "binding" }
	u := measure(machines, pending, map[string]bool{"released": true}, 10, "new", binding)
	if u.bound != 1 || u.live != 10 {
		t.Fatalf("bound %d live %d, want 1 (claim-c counts as pending) and 10", u.bound, u.live)
	}
	if len(u.released) != 1 || u.released[0].Name != "released" {
		t.Fatalf("released %v, want the Machine whose replica was given back", u.released)
	}
	var got []string
	for _, m := range u.victims {
		got = append(got, m.Name)
	}
	want := []string{"ours", "outdated", "no-node", "new-node", "old-node"}
	if len(got) != len(want) {
		t.Fatalf("victims %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("victims %v, want %v", got, want)
		}
	}
	if v := pickVictim(u.victims, map[string]bool{"ours": true}, t0.Add(90*time.Second)); v == nil || v.Name != "new-node" {
		t.Fatalf("pickVictim after t0+90s: %v, want new-node", v)
	}
	// Replicas below the live Machines: the MachineSet has yet to remove
	// one, the marked Machine first. Its give-back is under way, so it is
	// no victim for another.
	u = measure(machines, pending, map[string]bool{"released": true}, 9, "new", binding)
	if v := pickVictim(u.victims, nil, time.Time{}); v == nil || v.Name != "outdated" {
		t.Fatalf("pickVictim while the MachineSet removes the marked Machine: %v, want outdated", v)
	}
	for _, m := range u.victims {
		if m.Name == "ours" {
			t.Fatalf("victims %v include the Machine whose give-back the MachineSet has yet to carry out", u.victims)
		}
	}
}

// A disagreement is acted on once it outlives the grace; a count a
// settling op was decided on is held back until the cache moves on.
func TestDebtsGraceAndStaleCounts(t *testing.T) {
	var d debts
	key := types.NamespacedName{Namespace: "ns", Name: "md"}
	t0 := time.Now()
	if since := d.observe(key, true, t0); !since.Equal(t0) {
		t.Fatalf("first observation since %v", since)
	}
	if since := d.observe(key, true, t0.Add(time.Minute)); !since.Equal(t0) {
		t.Fatal("a lasting disagreement restarted")
	}
	if since := d.observe(key, false, t0.Add(time.Minute)); since.Equal(t0) {
		t.Fatal("a change of sign did not restart")
	}
	d.decided(key, 5, t0)
	if !d.stale(key, 5, t0.Add(time.Second)) {
		t.Fatal("the count just decided on is not held back")
	}
	if d.stale(key, 4, t0.Add(time.Second)) || d.stale(key, 5, t0.Add(2*time.Second)) {
		t.Fatal("a count that moved on (or came back) is still held back")
	}
	d.decided(key, 5, t0)
	if d.stale(key, 5, t0.Add(settledLag+time.Second)) {
		t.Fatal("held back beyond settledLag")
	}
}

// A held replica keeps its count: holding and taking it change neither
// spec.replicas nor owned-replicas, the reservation that takes it gets its
// raise time (so the Machine made for that raise may be bound to it), and a
// retried hold, take or give-back applies once.
func TestHeldReplicasChangeNoCountUntilGivenBack(t *testing.T) {
	md := mdWith(2, "0") // 2 replicas of someone else
	raised := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	apply(t, md, &op{kind: opReserve, name: "a", since: raised}, &op{kind: opReserve, name: "b", since: raised.Add(time.Minute)})
	if owned(t, md) != 2 || *md.Spec.Replicas != 4 {
		t.Fatalf("owned %d replicas %d, want 2 and 4", owned(t, md), *md.Spec.Replicas)
	}
	gone := raised.Add(5 * time.Minute)
	apply(t, md, &op{kind: opHold, name: "a", since: gone}, &op{kind: opHold, name: "a", since: gone.Add(time.Second)}, &op{kind: opHold, name: "b", since: gone})
	held, err := heldReplicas(md)
	if err != nil || len(held) != 2 || !held["a"].Raised.Equal(raised) || !held["a"].Held.Equal(gone) {
		t.Fatalf("held %v (%v), want a and b, a raised at %s and held at %s", held, err, raised, gone)
	}
	if owned(t, md) != 2 || *md.Spec.Replicas != 4 {
		t.Fatalf("holding changed the counts: owned %d replicas %d, want 2 and 4", owned(t, md), *md.Spec.Replicas)
	}
	c := &op{kind: opReserve, name: "c", since: gone.Add(time.Second)}
	apply(t, md, c, &op{kind: opReserve, name: "c", since: gone.Add(2 * time.Second)})
	pending, _ := pendingOf(md)
	if !c.took || !pending["c"].Equal(raised) || owned(t, md) != 2 || *md.Spec.Replicas != 4 {
		t.Fatalf("c took a held replica %v, reserved at %s (want a's raise %s), owned %d replicas %d (want 2 and 4)",
			c.took, pending["c"], raised, owned(t, md), *md.Spec.Replicas)
	}
	if held, _ := heldReplicas(md); len(held) != 1 || held["b"].Raised.IsZero() {
		t.Fatalf("held %v after c took the oldest, want b's", held)
	}
	apply(t, md, &op{kind: opGiveBackHeld, name: "b"}, &op{kind: opGiveBackHeld, name: "b"}, &op{kind: opGiveBackHeld, name: "a"})
	if held, _ := heldReplicas(md); len(held) != 0 || owned(t, md) != 1 || *md.Spec.Replicas != 3 {
		t.Fatalf("held %v owned %d replicas %d after giving b back, want none, 1 and 3", held, owned(t, md), *md.Spec.Replicas)
	}
	// With nothing held, a reservation raises again.
	d := &op{kind: opReserve, name: "d", since: gone.Add(time.Hour)}
	apply(t, md, d)
	if d.took || owned(t, md) != 2 || *md.Spec.Replicas != 4 {
		t.Fatalf("d took %v, owned %d replicas %d, want a raise to 2 and 4", d.took, owned(t, md), *md.Spec.Replicas)
	}
}

// A malformed held-replicas annotation (edited by hand) refuses the write
// and names the key, rather than lose the count.
func TestMalformedHeldReplicasNamesTheAnnotation(t *testing.T) {
	md := mdWith(1, "1")
	md.Annotations[HeldReplicasAnnotation] = "{not json"
	_, err := applyOps(md, []*op{{kind: opReserve, name: "a", since: time.Now()}}, nil)
	if err == nil || !strings.Contains(err.Error(), HeldReplicasAnnotation) || !strings.Contains(err.Error(), "ns/md") {
		t.Fatalf("error %v, want one naming ns/md and %s", err, HeldReplicasAnnotation)
	}
}

func pendingOf(md *clusterv1.MachineDeployment) (map[string]time.Time, error) {
	return hub.PendingNodeClaims(md)
}

// A NodeClaim whose Machine someone else deleted before it launched
// reclaims that Machine's replica: a reservation raised at the Machine's
// creation, no count changed. A spare give-back or forgive decided before
// the reclaim (its read lists no such reservation) is refused at the write,
// so the replica is not given away under the NodeClaim.
func TestAReclaimedReplicaIsNotGivenBackUnderTheNodeClaim(t *testing.T) {
	md := mdWith(4, "2") // two of Karpenter's, one bound Machine deleted by the MachineSet
	decidedOn := map[string]bool{}
	created := time.Date(2026, 11, 28, 8, 45, 26, 0, time.UTC)
	if !apply(t, md, &op{kind: opReclaim, name: "a", since: created}) || apply(t, md, &op{kind: opReclaim, name: "a", since: time.Now()}) {
		t.Fatal("a reclaim must apply once")
	}
	pending, _ := hub.PendingNodeClaims(md)
	if !pending["a"].Equal(created) || owned(t, md) != 2 || *md.Spec.Replicas != 4 {
		t.Fatalf("after the reclaim: pending %v, owned %d, replicas %d; want a raised at %s, 2, 4", pending, owned(t, md), *md.Spec.Replicas, created)
	}
	spare := &op{kind: opSpare, expect: 2, pendingAt: decidedOn}
	if apply(t, md, spare) || !spare.reclaimed {
		t.Fatalf("a spare give-back decided before the reclaim applied (reclaimed=%v)", spare.reclaimed)
	}
	if apply(t, md, &op{kind: opForgive, expect: 2, pendingAt: decidedOn}) {
		t.Fatal("a forgive decided before the reclaim applied")
	}
	// Decided on a read that shows the reservation: it applies.
	if !apply(t, md, &op{kind: opSpare, expect: 2, pendingAt: map[string]bool{"a": true}}) || owned(t, md) != 1 || *md.Spec.Replicas != 3 {
		t.Fatalf("a give-back decided on the reclaim's read: owned %d replicas %d, want 1 and 3", owned(t, md), *md.Spec.Replicas)
	}
}

// Stranded reservations decided in one pass on one read drop no more
// owned replicas than someone else took away (model seed 109: eleven
// dropped for a deficit of one, handing ten replicas to others).
func TestLostReservationsDropNoMoreThanTheDeficit(t *testing.T) {
	md := mdWith(2, "3") // someone lowered the replicas below Karpenter's three
	now := time.Now()
	apply(t, md, &op{kind: opReserve, name: "a", since: now}, &op{kind: opReserve, name: "b", since: now}, &op{kind: opReserve, name: "c", since: now})
	md.Spec.Replicas = ptrTo(int32(4)) // 3+3 raised, then someone lowered by two: deficit of 2
	md.Annotations[OwnedReplicasAnnotation] = "6"
	ops := []*op{{kind: opLost, name: "a"}, {kind: opLost, name: "b"}, {kind: opLost, name: "c"}}
	apply(t, md, ops...)
	pending, _ := hub.PendingNodeClaims(md)
	if owned(t, md) != 4 || *md.Spec.Replicas != 4 || len(pending) != 1 {
		t.Fatalf("owned %d, replicas %d, pending %v: want 4, 4 and one reservation left (two lost for a deficit of two)", owned(t, md), *md.Spec.Replicas, pending)
	}
	if done := []bool{ops[0].done, ops[1].done, ops[2].done}; !done[0] || !done[1] || done[2] {
		t.Fatalf("ops done %v, want the first two", done)
	}
}

func ptrTo[T any](v T) *T { return &v }
