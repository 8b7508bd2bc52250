package model

import (
	"testing"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
)

// Found by the e2e RollingUpdate drift (CI at 56995b1): a rollout deletes
// two of Karpenter's bound Machines and its new MachineSet makes two
// unbound ones in their place, so two owned replicas are spare. The first
// give-back marked one unbound Machine and lowered the replicas; the next
// pass, before the MachineSet had removed it, picked that same marked
// Machine for the second give-back and lowered the replicas again. The
// MachineSet then had two Machines to remove and one marked: it took the
// other by its own order, a running node's Machine (the e2e saw the node
// drained and replaced, and under CI load the churn outlasted the test's
// six minutes). Each give-back must go with a Machine of its own.
func TestTwoSpareReplicasAreGivenBackWithTwoMachines(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	a, b, c := w.newClaim(), w.newClaim(), w.newClaim()
	w.mustLaunch(t, 20, a, b, c)
	w.rounds(30, func() bool { p, _ := hub.PendingNodeClaims(w.md("cheap")); return len(p) == 0 })
	keep := w.machineOf(c)
	if keep == nil || keep.Labels[clusterv1.MachineDeploymentNameLabel] != "cheap" {
		t.Fatalf("NodeClaim %s has Machine %v, want one of cheap", c, keep)
	}
	// The rollout: a's and b's Machines deleted, two unbound ones with
	// Nodes made in their place; core deletes a and b (instances gone).
	w.healthCheckDelete(w.machineOf(a))
	w.healthCheckDelete(w.machineOf(b))
	w.runMachineSets() // the deleted ones go
	w.runMachineSets() // two new ones
	w.runInfrastructure()
	w.runInfrastructure()
	w.timeOut(a)
	w.timeOut(b)
	var unbound []string
	for _, m := range w.machines() {
		if m.DeletionTimestamp.IsZero() && bound(&m) == "" && m.Status.NodeRef.IsDefined() {
			unbound = append(unbound, m.Name)
		}
	}
	if len(unbound) != 2 || w.replicas("cheap") != 3 {
		t.Fatalf("after the rollout: unbound Machines %v and %d replicas, want two and 3", unbound, w.replicas("cheap"))
	}

	// The spare replicas (reclaimed by a and b when their Machines went,
	// free once a and b are gone) outlast OrphanGrace: both are given back,
	// in one pass or two, before the MachineSet acts.
	w.hub.Sync()
	w.reconcile()
	w.now = w.now.Add(machinedeployment.OrphanGrace + time.Second)
	for i := 0; i < 3 && w.replicas("cheap") != 1; i++ {
		w.hub.Sync()
		w.reconcile()
		w.now = w.now.Add(time.Second)
	}
	if got := w.replicas("cheap"); got != 1 {
		t.Fatalf("cheap has %d replicas after the give-backs, want 1", got)
	}
	marks := 0
	for _, m := range w.machines() {
		if marked(&m) {
			marks++
		}
	}
	if marks != 2 {
		t.Errorf("%d Machines marked for two give-backs, want 2: one give-back reused the other's Machine", marks)
	}
	w.runMachineSets()
	w.noFailures(t)
	if m := w.machineOf(c); m == nil || m.Name != keep.Name {
		t.Fatalf("NodeClaim %s lost its Machine %s to the give-backs (now %v)", c, keep.Name, m)
	}
	if live := w.liveMachines("cheap"); live != 1 {
		t.Errorf("cheap has %d live Machines, want 1 (%s)", live, keep.Name)
	}
}
