package model

import (
	"errors"
	"testing"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinedeployment/mdutil"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
)

// Several MachineSets (docs/design/machinedeployment-binding.md, "Which
// MachineSet loses a replica"): during a rollout Cluster API does not take
// a lowering of the MachineDeployment's replicas from the MachineSet of the
// Machine the provider marked. Under OnDelete it takes it from the oldest
// out-of-date MachineSet first; a mark on a Machine of the new MachineSet
// covers nothing there, and the old MachineSet removes a running Machine
// (here Karpenter's, bound to a NodeClaim that is not being deleted).

// noneRemoved fails for each Machine a MachineSet removed while it ran
// (a Node), unmarked, for a NodeClaim that was not being deleted.
func (w *world) noneRemoved(t *testing.T, when string) {
	t.Helper()
	for _, r := range w.removedRunning {
		t.Errorf("%s: %s", when, r)
	}
}

// releaseFinishes lets the world run until NodeClaim c's release is over
// and checks it finished with no running Machine removed and no failure.
func (w *world) releaseFinishes(t *testing.T, c string) {
	t.Helper()
	w.rounds(20, func() bool { _, ok := w.claims[c]; return !ok })
	w.noneRemoved(t, "once "+c+"'s release finished")
	if _, ok := w.claims[c]; ok {
		t.Errorf("NodeClaim %s still terminating 20 rounds after its release", c)
	}
	w.noFailures(t)
}

// lives reports whether a Machine exists and is not being deleted.
func (w *world) lives(name string) bool {
	for _, m := range w.machines() {
		if m.Name == name {
			return m.DeletionTimestamp.IsZero()
		}
	}
	return false
}

// launchOnCheap launches n NodeClaims, all on cheap, and returns them.
func (w *world) launchOnCheap(t *testing.T, n int) []string {
	t.Helper()
	var claims []string
	for range n {
		claims = append(claims, w.newClaim())
	}
	w.mustLaunch(t, 20, claims...)
	w.rounds(3, func() bool { return false }) // registered, settled
	for _, c := range claims {
		if m := w.machineOf(c); m == nil || m.Labels[clusterv1.MachineDeploymentNameLabel] != "cheap" {
			t.Fatalf("NodeClaim %s launched on %v, want cheap", c, m)
		}
	}
	return claims
}

// rolledOut changes cheap's template under the given strategy and lets
// Cluster API make the new MachineSet; it returns the old and new
// MachineSets' names.
func (w *world) rolledOut(t *testing.T, onDelete bool) (string, string) {
	t.Helper()
	old := w.machineSetsOf(w.md("cheap"))
	if len(old) != 1 {
		t.Fatalf("cheap has %d MachineSets before the rollout, want 1", len(old))
	}
	w.now = w.now.Add(time.Second)
	w.rollout("cheap", onDelete)
	w.runMachineSets()
	md := w.md("cheap")
	sets := w.machineSetsOf(md)
	if len(sets) != 2 {
		t.Fatalf("cheap has %d MachineSets after the template change, want 2", len(sets))
	}
	// As Cluster API's: the new MachineSet's template is the
	// MachineDeployment's, the old one's is not, and the revisions follow.
	if upToDate, _ := mdutil.MachineTemplateUpToDate(&sets[0].Spec.Template, &md.Spec.Template); upToDate {
		t.Fatalf("the old MachineSet %s is up to date with the new template", sets[0].Name)
	}
	if upToDate, _ := mdutil.MachineTemplateUpToDate(&sets[1].Spec.Template, &md.Spec.Template); !upToDate {
		t.Fatalf("the new MachineSet %s is not up to date with the template", sets[1].Name)
	}
	if r := md.Annotations[clusterv1.RevisionAnnotation]; r != "2" || sets[1].Annotations[clusterv1.RevisionAnnotation] != r || sets[0].Annotations[clusterv1.RevisionAnnotation] != "1" {
		t.Fatalf("revisions: MachineDeployment %q, MachineSets %q and %q; want 2, 1 and 2", r,
			sets[0].Annotations[clusterv1.RevisionAnnotation], sets[1].Annotations[clusterv1.RevisionAnnotation])
	}
	return old[0].Name, sets[1].Name
}

// settleRollout ends the rollout as its user would (OnDelete: deleting the
// old MachineSet's Machines), lets everything settle, and checks that no
// NodeClaim hangs and the replicas converge.
func (w *world) settleRollout(t *testing.T) {
	t.Helper()
	w.settle()
	w.noFailures(t)
	if w.rolling() {
		t.Errorf("cheap still has an old MachineSet after settling")
	}
	for _, name := range w.claimNames() {
		if c := w.claims[name]; !c.launched || c.deleting {
			t.Errorf("NodeClaim %s hangs: launched %v, deleting %v", name, c.launched, c.deleting)
		}
	}
}

// TestALoweringDuringAnOnDeleteRolloutRemovesOnlyMarkedMachines: cheap
// (OnDelete) runs NodeClaims a and b on its first MachineSet; its template
// changes, and c, launched after, lands on the new MachineSet. c is
// deleted: the provider marks c's Machine. Lowering the replicas now makes
// Cluster API lower the old MachineSet, which removes a's or b's running
// Machine (before the gate looked at MachineSets, bb65fe7: "MachineSet
// cheap-ms removed Machine cheap-m3, running and bound to NodeClaim nc-1").
// Whatever the provider does instead, neither a's nor b's Machine goes,
// c's release completes, and once the user has rolled the old Machines by
// hand everything settles (owned = bound, replicas = owned + others).
func TestALoweringDuringAnOnDeleteRolloutRemovesOnlyMarkedMachines(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.reconcile()
	w.launchOnCheap(t, 2)
	oldSet, newSet := w.rolledOut(t, true)
	c := w.launchOnCheap(t, 1)[0]
	mc := w.machineOf(c)
	if got := machineSetName(mc); got != newSet || mc.Labels[clusterv1.MachineSetNameLabel] != newSet {
		t.Fatalf("NodeClaim %s's Machine %s is in MachineSet %s (label %q), want the new one %s", c, mc.Name, got, mc.Labels[clusterv1.MachineSetNameLabel], newSet)
	}
	if n := len(w.oldMachines("cheap")); n != 2 {
		t.Fatalf("the old MachineSet %s holds %d Machines, want a's and b's", oldSet, n)
	}

	// c is deleted (consolidation): core's termination releases its Machine.
	w.startDeleting(c)
	_ = w.remove(c)
	w.runMachineSets() // Cluster API sees the write
	w.noneRemoved(t, "once Cluster API saw c's release")
	w.releaseFinishes(t, c)

	w.settleRollout(t)
}

// TestALoweringDuringARollingUpdateRemovesOnlyMarkedMachines: the same
// under RollingUpdate (maxSurge 1, maxUnavailable 0). The user's two
// Machines are being replaced; c, launched during the rollout, is bound to
// a Machine of the new MachineSet. Cluster API has just taken the old
// MachineSet down to one Machine (the user's) and not raised the new one
// again: as many Machines as replicas. c is deleted: lowering the replicas
// would make Cluster API take the old MachineSet's last Machine, running,
// before its replacement exists, and keep c's marked Machine.
func TestALoweringDuringARollingUpdateRemovesOnlyMarkedMachines(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 2, "dear": 0}, nil, nil)
	w.reconcile()
	_, newSet := w.rolledOut(t, false) // the new MachineSet makes its surge Machine
	w.now = w.now.Add(time.Second)
	c := w.newClaim()
	_ = w.create(c)    // raised: 3 replicas
	w.runMachineSets() // the new MachineSet grows to 2: c's Machine
	mc := w.bindNow(t, c)
	if got := machineSetName(mc); got != newSet {
		t.Fatalf("NodeClaim %s's Machine %s is in MachineSet %s, want the new one %s", c, mc.Name, got, newSet)
	}
	w.runInfrastructure()
	w.runInfrastructure()
	w.hub.Sync()
	if err := w.create(c); err != nil {
		t.Fatalf("NodeClaim %s not launched: %v", c, err)
	}
	w.register()
	// Both new Machines are available: Cluster API takes one of the
	// user's old Machines.
	w.runMachineSets()
	old := w.oldMachines("cheap")
	if len(old) != 1 || !w.userOwned[old[0].Name] {
		var names []string
		for _, m := range old {
			names = append(names, m.Name)
		}
		t.Fatalf("the old MachineSet holds %v, want one of the user's Machines", names)
	}
	if r, live := w.replicas("cheap"), w.liveMachines("cheap"); r != 3 || live != 3 {
		t.Fatalf("cheap has %d replicas and %d live Machines, want 3 and 3", r, live)
	}
	w.hub.Sync()

	w.startDeleting(c)
	_ = w.remove(c)
	w.runMachineSets() // Cluster API sees the write
	if !w.lives(old[0].Name) {
		t.Errorf("the user's running Machine %s was removed for %s's release, before its replacement", old[0].Name, c)
	}
	w.releaseFinishes(t, c)
	w.settleRollout(t)
}

// TestAFailedLaunchDuringAnOnDeleteRolloutFailsOver: cheap (OnDelete) runs
// a and b on its old MachineSet; its template changes and its capacity is
// exhausted. NodeClaim c raises on cheap, its Machine comes from the new
// MachineSet and fails to launch. The provider marks it, but may not lower
// (Cluster API would take the old MachineSet's a or b): the failed Machine
// waits for its lowering, and c's launch fails over (InsufficientCapacity:
// core deletes c and chooses again) rather than retrying on cheap, which
// raised one more replica per retry (seed 5 of the model went from 17 to 26
// replicas for two NodeClaims before 2000 steps).
func TestAFailedLaunchDuringAnOnDeleteRolloutFailsOver(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.reconcile()
	w.launchOnCheap(t, 2)
	w.rolledOut(t, true)
	w.exhausted["cheap"] = true
	before := w.replicas("cheap")
	c := w.newClaim()
	err := errors.New("not tried")
	for i := 0; i < 12 && err != nil && !cloudprovider.IsInsufficientCapacityError(err); i++ {
		w.now = w.now.Add(time.Second)
		err = w.create(c)
		w.runMachineSets()
		w.hub.Sync()
		w.reconcile()
		w.runInfrastructure()
		w.hub.Sync()
	}
	// Failed over: launched on dear (Launch chooses again at once), or
	// InsufficientCapacity for core to choose again.
	if err != nil && !cloudprovider.IsInsufficientCapacityError(err) {
		t.Fatalf("NodeClaim %s's launch never failed over: last error %v; cheap's replicas %d -> %d", c, err, before, w.replicas("cheap"))
	}
	if m := w.machineOf(c); err == nil && (m == nil || m.Labels[clusterv1.MachineDeploymentNameLabel] != "dear") {
		t.Fatalf("NodeClaim %s launched on %v, want dear", c, m)
	}
	if r := w.replicas("cheap"); r > before+1 {
		t.Fatalf("cheap's replicas went %d -> %d for one NodeClaim's failed launch", before, r)
	}
	w.noneRemoved(t, "after the failed launch")
	w.noFailures(t)
	w.settleRollout(t)
}
