package model

import (
	"context"
	"errors"
	"sort"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

// Deterministic scenarios for the defects of issue 16, one each, in the
// model's world (fake hub, Cluster API's MachineSet rules, the real
// provider code). Each fails on the code before the issue (see the commit
// that added it for how that was checked).

// round is one deterministic turn of every actor, one second later: core
// creates the pending NodeClaims and deletes the deleting ones, the
// provider's controller reconciles, the MachineSets create and delete
// Machines, the infrastructure launches them.
func (w *world) round() {
	w.now = w.now.Add(time.Second)
	for _, name := range w.claimNames() {
		if c := w.claims[name]; !c.launched && !c.deleting {
			_ = w.create(name)
		}
	}
	for _, name := range w.claimNames() {
		if w.claims[name].deleting {
			_ = w.remove(name)
		}
	}
	w.reconcile()
	w.runMachineSets()
	w.reconcile()
	w.runInfrastructure()
	w.register()
	w.collectGone()
	w.checkState()
}

// rounds runs n rounds, or fewer when done says so.
func (w *world) rounds(n int, done func() bool) {
	for i := 0; i < n && !done(); i++ {
		w.round()
	}
}

func (w *world) claimNames() []string {
	names := make([]string, 0, len(w.claims))
	for name := range w.claims {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// machineOf returns the live Machine bound to claim (API server's truth).
func (w *world) machineOf(claim string) *clusterv1.Machine {
	for _, m := range w.machines() {
		if bound(&m) == claim && m.DeletionTimestamp.IsZero() && !marked(&m) {
			return &m
		}
	}
	return nil
}

func (w *world) launched(claims ...string) func() bool {
	return func() bool {
		for _, c := range claims {
			if s, ok := w.claims[c]; !ok || !s.launched {
				return false
			}
		}
		return true
	}
}

func (w *world) noFailures(t *testing.T) {
	t.Helper()
	if len(w.failures) > 0 {
		t.Fatalf("invariants broken:\n  %v", dedupe(w.failures))
	}
}

// replicas returns a MachineDeployment's spec.replicas (API server's truth).
func (w *world) replicas(md string) int32 { return ptr.Deref(w.md(md).Spec.Replicas, 0) }

// liveMachines counts a MachineDeployment's Machines not being deleted.
func (w *world) liveMachines(md string) int {
	n := 0
	for _, m := range w.machines() {
		if m.Labels[clusterv1.MachineDeploymentNameLabel] == md && m.DeletionTimestamp.IsZero() {
			n++
		}
	}
	return n
}

// ownersMachinesUntouched fails unless every Machine the owner had before
// Karpenter still exists, unbound and unmarked.
func (w *world) ownersMachinesUntouched(t *testing.T) {
	t.Helper()
	live := map[string]clusterv1.Machine{}
	for _, m := range w.machines() {
		live[m.Name] = m
	}
	for name := range w.userOwned {
		m, ok := live[name]
		switch {
		case !ok || !m.DeletionTimestamp.IsZero():
			t.Errorf("the owner's Machine %s (with a running Node) was deleted", name)
		case bound(&m) != "":
			t.Errorf("the owner's Machine %s (with a running Node) was bound to NodeClaim %s", name, bound(&m))
		case marked(&m):
			t.Errorf("the owner's Machine %s (with a running Node) was marked for deletion", name)
		}
	}
}

// Defect 2: NodeClaims waiting for a replica never take the owner's running
// Machines, neither young ones (made just before the raise) nor old ones
// while a replica is spare (someone deleted a Karpenter Machine).
func TestPendingNodeClaimsNeverTakeTheOwnersRunningMachines(t *testing.T) {
	t.Run("owner's Machines made just before the raise", func(t *testing.T) {
		w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
		// The owner scales to 2 and the Machines come up, 3 s before
		// Karpenter needs 3 nodes.
		w.setReplicas("cheap", 2)
		w.runMachineSets()
		w.runInfrastructure()
		w.runInfrastructure()
		for _, m := range w.machines() {
			w.userOwned[m.Name] = true
		}
		w.now = w.now.Add(3 * time.Second)
		a, b, c := w.newClaim(), w.newClaim(), w.newClaim()
		w.rounds(10, w.launched(a, b, c))
		w.noFailures(t)
		w.ownersMachinesUntouched(t)
		if !w.launched(a, b, c)() {
			t.Fatalf("NodeClaims %s %s %s not all launched in 10 rounds", a, b, c)
		}
		if got := w.replicas("cheap"); got != 5 {
			t.Errorf("cheap has %d replicas, want 5 (the owner's 2 and one per NodeClaim)", got)
		}
	})
	t.Run("30-day-old Machines while a replica is spare", func(t *testing.T) {
		w := newWorld(t, map[string]int32{"cheap": 2, "dear": 0}, nil, nil)
		a := w.newClaim()
		w.rounds(10, w.launched(a))
		if !w.launched(a)() {
			t.Fatalf("NodeClaim %s not launched in 10 rounds", a)
		}
		// Bookkeeping settles: a's reservation is dropped (it is bound).
		w.rounds(30, func() bool { p, _ := hub.PendingNodeClaims(w.md("cheap")); return len(p) == 0 })
		// A MachineHealthCheck deletes a's Machine: a's replica is spare.
		w.healthCheckDelete(w.machineOf(a))
		w.runMachineSets()
		w.now = w.now.Add(time.Second)
		b, c, d := w.newClaim(), w.newClaim(), w.newClaim()
		w.rounds(10, w.launched(b, c, d))
		w.noFailures(t)
		w.ownersMachinesUntouched(t)
		if !w.launched(b, c, d)() {
			t.Fatalf("NodeClaims %s %s %s not all launched in 10 rounds", b, c, d)
		}
	})
}

// Defect 3: a burst of NodeClaims on a MachineDeployment one replica below
// its max-size raises it to the max, not past it; the NodeClaims past it
// get InsufficientCapacity (Karpenter takes the next offering). And a
// NodeClaim deleted while the MachineDeployment is at its min-size leaves
// the replicas at the minimum.
func TestReplicasStayWithinMinAndMaxSize(t *testing.T) {
	t.Run("three NodeClaims at once, one replica below max-size", func(t *testing.T) {
		w := newWorld(t, map[string]int32{"cheap": 4, "dear": 0},
			map[string]map[string]string{"cheap": {instancetype.MaxSizeAnnotation: "5"}}, nil)
		w.reconcile() // the store shows cheap available (4 < 5)
		claims := []string{w.newClaim(), w.newClaim(), w.newClaim()}
		var wg sync.WaitGroup
		errs := make([]error, len(claims))
		for i, name := range claims {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_, errs[i] = w.provider.Launch(ctx, name, nil, func(types.NamespacedName) {}, func(*types.NamespacedName) (instancetype.Source, error) {
					src, ok := w.store.Get(types.NamespacedName{Namespace: ns, Name: "cheap"})
					if !ok {
						return instancetype.Source{}, errors.New("cheap not in the store")
					}
					return src, nil
				})
			}()
		}
		wg.Wait()
		if got := w.replicas("cheap"); got > 5 {
			t.Fatalf("cheap raised to %d replicas, past its max-size 5", got)
		}
		refused := 0
		for _, err := range errs {
			if cloudprovider.IsInsufficientCapacityError(err) {
				refused++
			}
		}
		if refused != 2 {
			t.Errorf("%d of 3 NodeClaims got InsufficientCapacity, want 2 (errors: %v)", refused, errs)
		}
		w.noFailures(t)
	})
	t.Run("NodeClaim deleted at min-size", func(t *testing.T) {
		w := newWorld(t, map[string]int32{"cheap": 2, "dear": 0}, nil, nil)
		a := w.newClaim()
		w.rounds(10, w.launched(a))
		if !w.launched(a)() {
			t.Fatalf("NodeClaim %s not launched in 10 rounds", a)
		}
		m := w.machineOf(a)
		// The owner sets the minimum at the current size.
		w.setAnnotation("cheap", instancetype.MinSizeAnnotation, "3")
		w.startDeleting(a)
		w.rounds(10, func() bool { _, ok := w.claims[a]; return !ok })
		w.rounds(3, func() bool { return false })
		if got := w.replicas("cheap"); got != 3 {
			t.Errorf("cheap has %d replicas after a NodeClaim was deleted at min-size 3, want 3", got)
		}
		for _, other := range w.machines() {
			if other.Name == m.Name {
				t.Errorf("Machine %s of the deleted NodeClaim %s still exists", m.Name, a)
			}
		}
		w.ownersMachinesUntouched(t)
		w.noFailures(t)
	})
}

// Defect 4 (and 5): a MachineDeployment whose instances never launch
// (InsufficientInstanceCapacity) makes the NodeClaim move to the next
// offering at once, within the same Create, and keeps no failed replica.
func TestAFailedLaunchMovesToTheNextOfferingAndKeepsNoFailedReplica(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 1, "dear": 0}, nil, nil)
	w.exhausted["cheap"] = true
	a := w.newClaim()
	w.rounds(8, w.launched(a))
	if !w.launched(a)() {
		t.Fatalf("NodeClaim %s not launched in 8 rounds: still on %v", a, w.claims[a].chosen)
	}
	if m := w.machineOf(a); m == nil || m.Labels[clusterv1.MachineDeploymentNameLabel] != "dear" {
		t.Fatalf("NodeClaim %s launched on %v, want a Machine of dear", a, m)
	}
	w.rounds(3, func() bool { return false })
	if got, live := w.replicas("cheap"), w.liveMachines("cheap"); got != 1 || live != 1 {
		t.Errorf("cheap holds %d replicas and %d Machines, want the owner's 1 (no failed replica held)", got, live)
	}
	w.ownersMachinesUntouched(t)
	w.noFailures(t)
}

// Defect 7: a NodeClaim deleted before the cache shows the Machine bound to
// it releases that Machine, and the replica is given back once: the
// owner's replicas and Machines stay.
func TestNodeClaimDeletedWhileTheCacheLagsReleasesItsMachine(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 2, "dear": 0}, nil, nil)
	w.reconcile() // the provider has counted its (no) replicas
	a := w.newClaim()
	_ = w.create(a) // replica raised, no Machine yet
	w.runMachineSets()
	w.hub.Sync()
	w.hub.SetLag(true) // the cache stops here: it never shows the binding below
	w.now = w.now.Add(time.Second)
	w.reconcile() // binds the new Machine to a
	w.runInfrastructure()
	w.runInfrastructure() // the Machine gets its instance and Node
	if w.machineOf(a) == nil {
		t.Fatal("no Machine bound to the NodeClaim")
	}
	// Core deletes the NodeClaim; the cache does not show the binding.
	w.startDeleting(a)
	if err := w.remove(a); err != nil {
		t.Logf("Delete: %v", err)
	}
	w.hub.SetLag(false)
	for range 60 { // past the provider's grace periods
		w.round()
	}
	if got := w.replicas("cheap"); got != 2 {
		t.Errorf("cheap has %d replicas, want the owner's 2", got)
	}
	if live := w.liveMachines("cheap"); live != 2 {
		t.Errorf("cheap has %d live Machines, want the owner's 2", live)
	}
	w.ownersMachinesUntouched(t)
	w.noFailures(t)
}

// Defect 8: a member label on the MachineDeployment's Machine template (as
// ClusterClass topology copies it) does not keep new Machines from being
// bound: NodeClaims launch.
func TestMemberLabelOnTheMachineTemplateDoesNotStallLaunches(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 1, "dear": 0}, nil, map[string]string{v1alpha1.KarpenterMemberLabel: ""})
	a, b := w.newClaim(), w.newClaim()
	w.rounds(10, w.launched(a, b))
	if !w.launched(a, b)() {
		t.Fatalf("NodeClaims %s %s not launched in 10 rounds", a, b)
	}
	if got := w.replicas("cheap"); got != 3 {
		t.Errorf("cheap has %d replicas, want 3", got)
	}
	w.ownersMachinesUntouched(t)
	w.noFailures(t)
}
