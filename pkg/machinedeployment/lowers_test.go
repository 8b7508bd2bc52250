package machinedeployment

import (
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// rollout builds an MD mid-rollout: one MachineSet per template given, the
// last one's template the MD's (up to date), each created a minute after
// the one before; replicas and Machines per MachineSet.
func rollout(strategy clusterv1.MachineDeploymentRolloutStrategyType, replicas []int32, machines [][]*clusterv1.Machine) (*clusterv1.MachineDeployment, []*clusterv1.MachineSet, []*clusterv1.Machine) {
	md := planMD(0, 0, nil)
	md.UID = "uid-md"
	md.Spec.Rollout.Strategy.Type = strategy
	var sets []*clusterv1.MachineSet
	var all []*clusterv1.Machine
	var total int32
	for i, n := range replicas {
		name := "ms" + string(rune('a'+i))
		tmpl := clusterv1.MachineTemplateSpec{Spec: clusterv1.MachineSpec{ClusterName: "c1", Version: "v1.3" + string(rune('0'+i)),
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "AWSMachineTemplate", Name: name}}}
		ms := &clusterv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(i) * time.Minute)),
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(md, clusterv1.GroupVersion.WithKind("MachineDeployment"))}},
			Spec:   clusterv1.MachineSetSpec{Replicas: ptr.To(n), Template: tmpl},
			Status: clusterv1.MachineSetStatus{Replicas: ptr.To(int32(len(machines[i])))}}
		for _, m := range machines[i] {
			m.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(ms, clusterv1.GroupVersion.WithKind("MachineSet"))}
			all = append(all, m)
		}
		sets = append(sets, ms)
		total += n
		md.Spec.Template = tmpl
	}
	md.Spec.Replicas = ptr.To(total)
	return md, sets, all
}

func plannedWith(t *testing.T, md *clusterv1.MachineDeployment, owned int32, sets []*clusterv1.MachineSet, machines []*clusterv1.Machine, intents ...*intent) outcome {
	t.Helper()
	md.Annotations[OwnedReplicasAnnotation] = "0"
	recs, err := readRecords(md)
	if err != nil {
		t.Fatal(err)
	}
	recs.owned = owned
	return plan(md, recs, view{machines: machines, sets: sets, free: func(string) bool { return false }}, intents)
}

// An OnDelete rollout: the old MachineSet (a) holds two running Karpenter
// nodes, the new one (b) the Machine of a NodeClaim being deleted.
// Cluster API takes a lowering off the oldest out-of-date MachineSet, so
// lowering for b's marked Machine would remove a running node of a: the
// gate refuses it, saying why.
func TestOnDeleteLoweringForAMarkInTheNewMachineSetIsRefused(t *testing.T) {
	a1, a2 := machine("a1", t0, boundTo("A1"), withNode), machine("a2", t0, boundTo("A2"), withNode)
	b1 := machine("b1", t0.Add(2*time.Minute), boundTo("B1"), withNode, markedWith(markPrefix+": NodeClaim B1 deleted"))
	md, sets, all := rollout(clusterv1.OnDeleteMachineDeploymentStrategyType, []int32{2, 1}, [][]*clusterv1.Machine{{a1, a2}, {b1}})
	in := &intent{kind: intentLower, claim: "B1", machine: b1}
	out := plannedWith(t, md, 3, sets, all, in)
	if out.replicas != 3 || !errors.Is(in.err, errLowersElsewhere) {
		t.Fatalf("replicas %d (want 3), err %v (want errLowersElsewhere): Cluster API would remove a1 or a2, running nodes", out.replicas, in.err)
	}
}

// The same rollout with the mark in the oldest out-of-date MachineSet (a
// drifted node released): the lowering comes off that MachineSet, which
// removes the marked Machine first.
func TestOnDeleteLoweringForAMarkInTheOldestOldMachineSetGoesThrough(t *testing.T) {
	a1 := machine("a1", t0, boundTo("A1"), withNode, markedWith(markPrefix+": NodeClaim A1 deleted"))
	a2 := machine("a2", t0, boundTo("A2"), withNode)
	b1 := machine("b1", t0.Add(2*time.Minute), boundTo("B1"), withNode)
	md, sets, all := rollout(clusterv1.OnDeleteMachineDeploymentStrategyType, []int32{2, 1}, [][]*clusterv1.Machine{{a1, a2}, {b1}})
	in := &intent{kind: intentLower, claim: "A1", machine: a1}
	out := plannedWith(t, md, 3, sets, all, in)
	if out.replicas != 2 || in.err != nil {
		t.Fatalf("replicas %d (want 2), err %v", out.replicas, in.err)
	}
	// A second lowering in the same write, for a Machine of the new
	// MachineSet, has no mark of its own where Cluster API lowers.
	in2 := &intent{kind: intentLower, claim: "A1", machine: a1}
	in3 := &intent{kind: intentLower, claim: "B1", machine: b1}
	out = plannedWith(t, md, 3, sets, all, in2, in3)
	if out.replicas != 2 || !errors.Is(in3.err, errLowersElsewhere) {
		t.Fatalf("replicas %d (want 2), second lowering err %v (want errLowersElsewhere)", out.replicas, in3.err)
	}
}

// Two out-of-date MachineSets: Cluster API lowers the oldest first, so a
// mark in the younger old one does not cover a lowering.
func TestOnDeleteLowersTheOldestOutOfDateMachineSetFirst(t *testing.T) {
	a1 := machine("a1", t0, boundTo("A1"), withNode)
	b1 := machine("b1", t0.Add(time.Minute), boundTo("B1"), withNode, markedWith(markPrefix+": NodeClaim B1 deleted"))
	c1 := machine("c1", t0.Add(2*time.Minute), boundTo("C1"), withNode)
	md, sets, all := rollout(clusterv1.OnDeleteMachineDeploymentStrategyType, []int32{1, 1, 1}, [][]*clusterv1.Machine{{a1}, {b1}, {c1}})
	in := &intent{kind: intentLower, claim: "B1", machine: b1}
	if out := plannedWith(t, md, 3, sets, all, in); out.replicas != 3 || !errors.Is(in.err, errLowersElsewhere) {
		t.Fatalf("replicas %d err %v: Cluster API lowers msa (a1) first", out.replicas, in.err)
	}
}

// Once no out-of-date MachineSet has replicas, the up-to-date one is
// lowered: its marks cover again.
func TestOnDeleteLowersTheNewMachineSetOnceOldOnesAreEmpty(t *testing.T) {
	b1 := machine("b1", t0.Add(time.Minute), boundTo("B1"), withNode, markedWith(markPrefix+": NodeClaim B1 deleted"))
	b2 := machine("b2", t0.Add(time.Minute), boundTo("B2"), withNode)
	gone := machine("a1", t0, boundTo("A1"), withNode, deleting)
	md, sets, all := rollout(clusterv1.OnDeleteMachineDeploymentStrategyType, []int32{0, 2}, [][]*clusterv1.Machine{{gone}, {b1, b2}})
	in := &intent{kind: intentLower, claim: "B1", machine: b1}
	if out := plannedWith(t, md, 2, sets, all, in); out.replicas != 1 || in.err != nil {
		t.Fatalf("replicas %d err %v, want 1 and none", out.replicas, in.err)
	}
}

// A rolling update, a paused MachineDeployment, or MachineSets that have
// not caught up with the MachineDeployment: Cluster API's choice cannot be
// told, so nothing is lowered, whatever is marked.
func TestNoLoweringWhileCLusterAPIsChoiceCannotBeTold(t *testing.T) {
	mk := func() (*clusterv1.MachineDeployment, []*clusterv1.MachineSet, []*clusterv1.Machine, *clusterv1.Machine) {
		a1 := machine("a1", t0, boundTo("A1"), withNode, markedWith(markPrefix+": NodeClaim A1 deleted"))
		b1 := machine("b1", t0.Add(time.Minute), boundTo("B1"), withNode, markedWith(markPrefix+": NodeClaim B1 deleted"))
		md, sets, all := rollout(clusterv1.OnDeleteMachineDeploymentStrategyType, []int32{1, 1}, [][]*clusterv1.Machine{{a1}, {b1}})
		return md, sets, all, a1
	}
	cases := map[string]func(*clusterv1.MachineDeployment, []*clusterv1.MachineSet){
		"rolling update": func(md *clusterv1.MachineDeployment, _ []*clusterv1.MachineSet) {
			md.Spec.Rollout.Strategy.Type = clusterv1.RollingUpdateMachineDeploymentStrategyType
		},
		"paused":           func(md *clusterv1.MachineDeployment, _ []*clusterv1.MachineSet) { md.Spec.Paused = ptr.To(true) },
		"replicas pending": func(md *clusterv1.MachineDeployment, _ []*clusterv1.MachineSet) { md.Spec.Replicas = ptr.To(int32(3)) },
		"old MachineSet not aligned": func(_ *clusterv1.MachineDeployment, sets []*clusterv1.MachineSet) {
			sets[0].Status.Replicas = ptr.To(int32(2))
		},
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			md, sets, all, a1 := mk()
			change(md, sets)
			r0 := ptr.Deref(md.Spec.Replicas, 0)
			in := &intent{kind: intentLower, claim: "A1", machine: a1}
			if out := plannedWith(t, md, r0, sets, all, in); out.replicas != r0 || !isNotCovered(in.err) {
				t.Fatalf("replicas %d (want %d), err %v (want not covered)", out.replicas, r0, in.err)
			}
		})
	}
}

// One MachineSet with Machines or replicas (an empty new one beside it is
// not a rollout in progress for the gate): the MachineDeployment's count,
// as before.
func TestOneActiveMachineSetIsGatedAsBefore(t *testing.T) {
	a1 := machine("a1", t0, boundTo("A1"), withNode, markedWith(markPrefix+": NodeClaim A1 deleted"))
	a2 := machine("a2", t0, boundTo("A2"), withNode)
	md, sets, all := rollout(clusterv1.RollingUpdateMachineDeploymentStrategyType, []int32{2, 0}, [][]*clusterv1.Machine{{a1, a2}, nil})
	in := &intent{kind: intentLower, claim: "A1", machine: a1}
	if out := plannedWith(t, md, 2, sets, all, in); out.replicas != 1 || in.err != nil {
		t.Fatalf("replicas %d err %v, want 1 and none", out.replicas, in.err)
	}
}

// The template changed and Cluster API has not made the new MachineSet yet
// (one MachineSet, out of date): a rolling update's first pass makes the
// new MachineSet with a surge Machine, and may take a lowering it sees only
// then off that Machine instead of the marked one, so the gate refuses
// until the new MachineSet shows. OnDelete lowers the old MachineSet, where
// the mark is, and a paused MachineDeployment makes no new MachineSet:
// both go through. Found by the model (seed 350).
func TestNoLoweringWhileARollingUpdateIsAboutToStart(t *testing.T) {
	for _, tc := range []struct {
		name     string
		strategy clusterv1.MachineDeploymentRolloutStrategyType
		paused   bool
		refused  bool
	}{
		{"rolling update", clusterv1.RollingUpdateMachineDeploymentStrategyType, false, true},
		{"OnDelete", clusterv1.OnDeleteMachineDeploymentStrategyType, false, false},
		{"paused rolling update", clusterv1.RollingUpdateMachineDeploymentStrategyType, true, false},
	} {
		a1 := machine("a1", t0, boundTo("A1"), withNode, markedWith(markPrefix+": NodeClaim A1 deleted"))
		a2 := machine("a2", t0, boundTo("A2"), withNode)
		md, sets, all := rollout(tc.strategy, []int32{2}, [][]*clusterv1.Machine{{a1, a2}})
		md.Spec.Template.Spec.InfrastructureRef.Name = "next-template"
		md.Spec.Paused = ptr.To(tc.paused)
		in := &intent{kind: intentLower, claim: "A1", machine: a1}
		out := plannedWith(t, md, 2, sets, all, in)
		switch {
		case tc.refused && (out.replicas != 2 || !errors.Is(in.err, errLowersElsewhere)):
			t.Errorf("%s: replicas %d err %v, want 2 and errLowersElsewhere", tc.name, out.replicas, in.err)
		case !tc.refused && (out.replicas != 1 || in.err != nil):
			t.Errorf("%s: replicas %d err %v, want 1 and none", tc.name, out.replicas, in.err)
		}
		// Once the new MachineSet shows, the gate is as before.
		if !tc.refused {
			continue
		}
		md.Spec.Template.Spec.InfrastructureRef.Name = sets[0].Spec.Template.Spec.InfrastructureRef.Name
		in = &intent{kind: intentLower, claim: "A1", machine: a1}
		if out := plannedWith(t, md, 2, sets, all, in); out.replicas != 1 || in.err != nil {
			t.Errorf("%s, template up to date: replicas %d err %v, want 1 and none", tc.name, out.replicas, in.err)
		}
	}
}
