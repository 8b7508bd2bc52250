package model

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
)

// Deterministic scenarios for the defects of issue 35, one each, in the
// model's world. Each failed on e402286 (the design before the rework):
// the comment of each says how.

// The review's critical path. NodeClaim A runs on cheap; NodeClaim B timed
// out before its Machine was made, so its replica is still up (replicas 2,
// Karpenter's 2); someone lowers spec.replicas to 1: the MachineSet keeps
// A's Machine. No provider write may lower the replicas further: the
// MachineSet would remove A's running Machine. On e402286 the held
// replica's give-back lowered them to 0 after OrphanGrace.
func TestAGiveBackDuringADeficitNeverRemovesARunningNode(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	a := w.newClaim()
	w.mustLaunch(t, 20, a)
	running := w.machineOf(a)
	w.stalled["cheap"] = true
	b := w.newClaim()
	_ = w.create(b)
	if got := w.replicas("cheap"); got != 2 {
		t.Fatalf("cheap has %d replicas, want 2 (a's and b's)", got)
	}
	w.now = w.now.Add(launchTimeout)
	w.timeOut(b)
	w.setReplicas("cheap", -1) // someone lowers to 1
	w.stalled["cheap"] = false
	w.now = w.now.Add(machinedeployment.OrphanGrace + time.Second)
	w.rounds(60, func() bool { return false })
	w.noFailures(t)
	if m := w.machineOf(a); m == nil || m.Name != running.Name || !m.DeletionTimestamp.IsZero() {
		t.Fatalf("NodeClaim %s lost its running Machine %s (now %v)", a, running.Name, m)
	}
	if got := w.replicas("cheap"); got != 1 {
		t.Errorf("cheap has %d replicas, want 1 (a's)", got)
	}
}

// The member label removed from a MachineDeployment while a reservation is
// in flight and a NodeClaim is being released: the reservation is bound
// (or given back), the release finishes, nothing hangs. On e402286 the
// controller returned before its bookkeeping: the NodeClaim stayed
// terminating and the reservation stayed raised.
func TestMemberLabelRemovedMidFlightStillCompletesEveryExit(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	a := w.newClaim()
	w.mustLaunch(t, 20, a)
	w.stalled["cheap"] = true
	b := w.newClaim()
	_ = w.create(b) // reserved on cheap, no Machine yet
	w.setLabel("cheap", v1alpha1.KarpenterMemberLabel, false)
	w.startDeleting(a) // consolidation: a's Machine is released
	w.stalled["cheap"] = false
	w.rounds(30, func() bool { _, ok := w.claims[a]; return !ok && w.launched(b)() })
	w.noFailures(t)
	if _, ok := w.claims[a]; ok {
		t.Fatalf("NodeClaim %s still terminating after its MachineDeployment lost the member label", a)
	}
	if !w.launched(b)() {
		t.Fatalf("NodeClaim %s, reserved before the label went, never launched", b)
	}
	w.startDeleting(b)
	w.rounds(30, func() bool { _, ok := w.claims[b]; return !ok })
	if _, ok := w.claims[b]; ok {
		t.Fatalf("NodeClaim %s still terminating", b)
	}
	w.rounds(40, func() bool { return false })
	w.noFailures(t)
	if got, live := w.replicas("cheap"), w.liveMachines("cheap"); got != 0 || live != 0 {
		t.Errorf("cheap has %d replicas and %d live Machines after every NodeClaim went, want 0 and 0", got, live)
	}
}

// Malformed bookkeeping on the cheapest MachineDeployment: it is left out
// of the offerings (a Source error naming the object and the annotation),
// and a NodeClaim that chose it before launches on the next. On e402286
// every launch that chose it failed with a plain error, pinned to it.
func TestMalformedRecordsOnTheCheapestLeaveItOutAndNameTheAnnotation(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.reconcile()
	w.stalled["cheap"] = true
	a := w.newClaim()
	_ = w.create(a) // chose cheap
	w.setAnnotation("cheap", hub.PendingNodeClaimsAnnotation, "{")
	w.reconcile()
	src, ok := w.store.Get(typesNN("cheap"))
	if !ok || src.Err == nil || !contains(src.Err.Error(), hub.PendingNodeClaimsAnnotation) || !contains(src.Err.Error(), "ns/cheap") {
		t.Fatalf("cheap's Source error %v: want one naming ns/cheap and %s", src.Err, hub.PendingNodeClaimsAnnotation)
	}
	b := w.newClaim()
	w.stalled["cheap"] = false
	w.mustLaunch(t, 20, b)
	if m := w.machineOf(b); m == nil || m.Labels[clusterv1.MachineDeploymentNameLabel] != "dear" {
		t.Fatalf("NodeClaim %s launched on %v, want dear", b, m)
	}
}

// A malformed min-size is a problem, not "no minimum": the
// MachineDeployment is left out and the Source names the annotation. On
// e402286 it silently meant no minimum.
func TestMalformedMinSizeIsReported(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 1, "dear": 0},
		map[string]map[string]string{"cheap": {instancetype.MinSizeAnnotation: "one"}}, nil)
	w.reconcile()
	src, ok := w.store.Get(typesNN("cheap"))
	if !ok || src.Err == nil || !contains(src.Err.Error(), instancetype.MinSizeAnnotation) {
		t.Fatalf("cheap's Source error %v: want one naming %s", src.Err, instancetype.MinSizeAnnotation)
	}
}

// A user scales a member MachineDeployment to 2; its Machines join (with
// Karpenter's unregistered taint, as the docs ask); a few seconds later
// pods are pending and NodeClaims raise. The user's Machines existed
// before those raises by the API server's clock and are never bound. On
// e402286 both were bound within 100 ms (the 10 s bindSkew window and a
// Node awaiting registration counted as bindable).
func TestAUsersYoungMachinesAreNeverTakenByALaterRaise(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.reconcile()
	w.setReplicas("cheap", 2)
	w.runMachineSets()
	w.runInfrastructure()
	w.runInfrastructure() // joined, awaiting registration
	users := map[string]bool{}
	for _, m := range w.mdMachines("cheap") {
		users[m.Name] = true
	}
	w.now = w.now.Add(3 * time.Second)
	a, b := w.newClaim(), w.newClaim()
	w.mustLaunch(t, 20, a, b)
	w.noFailures(t)
	for _, c := range []string{a, b} {
		if m := w.machineOf(c); m == nil || users[m.Name] {
			t.Errorf("NodeClaim %s bound to %v, one of the user's Machines %v", c, m, users)
		}
	}
}

// A user lowers a member MachineDeployment from 3 to 1 under Karpenter's
// three Machines: the MachineSet removes two, their NodeClaims end, core
// makes successors, which raise and are bound to Machines made for their
// own raises (never to the old, terminating NodeClaims), within a few
// rounds. On e402286 the new Machines were bound to the terminating
// NodeClaims and the successors waited out a full launch wait.
func TestReplicasTakenAwayRecoverWithoutBindingTerminatingNodeClaims(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	a, b, c := w.newClaim(), w.newClaim(), w.newClaim()
	w.mustLaunch(t, 20, a, b, c)
	w.setReplicas("cheap", -2)
	w.runMachineSets()
	w.runMachineSets()
	var gone []string
	for _, x := range []string{a, b, c} {
		if w.machineOf(x) == nil {
			gone = append(gone, x)
		}
	}
	if len(gone) != 2 {
		t.Fatalf("the MachineSet removed the Machines of %v, want two", gone)
	}
	w.rounds(5, func() bool { return false }) // core ends them
	var successors []string
	for range gone {
		successors = append(successors, w.newClaim())
	}
	start := w.now
	w.mustLaunch(t, 15, successors...)
	w.noFailures(t)
	if took := w.now.Sub(start); took > 15*time.Second {
		t.Errorf("successors launched after %s", took)
	}
	if got := w.replicas("cheap"); got != 3 {
		t.Errorf("cheap has %d replicas, want 3 (one Karpenter kept, two successors)", got)
	}
}

// Machines of a member MachineDeployment that no NodeClaim owns (a user
// raised the replicas) are counted once the MachineSet has settled. On
// e402286 nothing counted or reported them.
func TestMachinesNoNodeClaimOwnsAreCounted(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.reconcile()
	w.setReplicas("cheap", 2)
	w.runMachineSets()
	w.runInfrastructure()
	w.runInfrastructure()
	w.now = w.now.Add(machinedeployment.OrphanGrace + time.Second)
	w.hub.Sync()
	w.reconcile()
	m := &dto.Metric{}
	if err := metrics.UnownedMachines.WithLabelValues(ns, "cheap").Write(m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetGauge().GetValue(); got != 2 {
		t.Fatalf("unowned Machines of cheap: %v, want 2", got)
	}
}
