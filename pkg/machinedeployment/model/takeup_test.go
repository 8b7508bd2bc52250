package model

import (
	"context"
	"testing"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
)

// Issue 45 (the world's work in MachineDeployment mode): a burst's Machines
// come from the MachineSet one after another, and each pass binds the ones
// made since the last. Dropping each pass's take-ups from the records in a
// write of their own cost one MachineDeployment write per node, each copied
// by Cluster API onto the MachineSet (which reconciles again). Take-ups
// that no other write carries are written together, TakeUpDelay after a
// pass first saw one; meanwhile every decision counts them done.
func TestReservationsMachinesTookUpAreDroppedTogether(t *testing.T) {
	w, claims, set := stalledBurst(t, 4)
	// Its Machines come one by one, a second apart, each bound by the
	// pass its creation starts.
	before := w.mdWrites.Load()
	for i := range claims {
		w.bindNext(t, set, time.Second, claims, i+1)
	}
	w.stalled["cheap"] = false
	if got := w.mdWrites.Load() - before; got != 0 {
		t.Errorf("the provider wrote MachineDeployment cheap %d times while binding its Machines within %s, want 0: take-ups wait to be written together", got, machinedeployment.TakeUpDelay)
	}
	if p, _ := hub.PendingNodeClaims(w.md("cheap")); len(p) == 0 {
		t.Fatalf("no reservation listed before TakeUpDelay passed: the scenario does not test the delay")
	}
	w.passAfter(machinedeployment.TakeUpDelay)
	if got := w.mdWrites.Load() - before; got != 1 {
		t.Errorf("the provider wrote MachineDeployment cheap %d times for the take-ups, want 1", got)
	}
	if p, _ := hub.PendingNodeClaims(w.md("cheap")); len(p) != 0 {
		t.Errorf("reservations %v still listed %s after their Machines took them up", p, machinedeployment.TakeUpDelay)
	}
	w.mustLaunch(t, 20, claims...)
	w.noFailures(t)
}

// While a burst is still binding (a reservation of the MachineDeployment
// still waits for its Machine), its take-ups are not written TakeUpDelay
// after the first: they wait until its last binding (one write for the
// whole burst), or TakeUpMaxDelay while it lasts. On a loaded management
// cluster a burst's Machines come over minutes, and each records write made
// Cluster API reconcile every Machine of the MachineDeployment again.
func TestABurstStillBindingWritesItsTakeUpsOnce(t *testing.T) {
	w, claims, set := stalledBurst(t, 4)
	before := w.mdWrites.Load()
	// Three Machines come TakeUpDelay apart; the fourth NodeClaim still
	// waits for its Machine after them.
	for i := range 3 {
		w.bindNext(t, set, machinedeployment.TakeUpDelay, claims, i+1)
	}
	w.passAfter(machinedeployment.TakeUpDelay)
	if got := w.mdWrites.Load() - before; got != 0 {
		t.Fatalf("the provider wrote MachineDeployment cheap %d times while a reservation still waited for its Machine (%s after the first take-up), want 0",
			got, 4*machinedeployment.TakeUpDelay)
	}
	// The last Machine: its pass binds it, the next writes every take-up.
	w.bindNext(t, set, machinedeployment.TakeUpDelay, claims, 4)
	w.passAfter(time.Second)
	w.passAfter(machinedeployment.TakeUpDelay)
	if got := w.mdWrites.Load() - before; got != 1 {
		t.Errorf("the provider wrote MachineDeployment cheap %d times for a burst's take-ups, want 1", got)
	}
	if p, _ := hub.PendingNodeClaims(w.md("cheap")); len(p) != 0 {
		t.Errorf("reservations %v still listed after the burst's last binding", p)
	}
	w.stalled["cheap"] = false
	w.mustLaunch(t, 20, claims...)
	w.noFailures(t)
}

// A burst whose last reservation never gets its Machine still has its
// take-ups written, TakeUpMaxDelay after the first.
func TestTakeUpsAreWrittenWithinTheMaxDelay(t *testing.T) {
	w, claims, set := stalledBurst(t, 2)
	w.bindNext(t, set, time.Second, claims, 1)
	before := w.mdWrites.Load()
	w.reconcile() // the first pass that sees the take-up
	w.hub.Sync()
	for range 2 {
		w.passAfter(machinedeployment.TakeUpMaxDelay/2 - time.Second)
	}
	if got := w.mdWrites.Load() - before; got != 0 {
		t.Fatalf("the take-up was written %d times before TakeUpMaxDelay, want 0", got)
	}
	w.passAfter(2 * time.Second)
	if got := w.mdWrites.Load() - before; got != 1 {
		t.Errorf("the provider wrote MachineDeployment cheap %d times by TakeUpMaxDelay, want 1 (the take-up)", got)
	}
	if p, _ := hub.PendingNodeClaims(w.md("cheap")); len(p) != 1 {
		t.Errorf("want only the unbound NodeClaim's reservation listed after TakeUpMaxDelay, got %v", p)
	}
	w.stalled["cheap"] = false
	w.mustLaunch(t, 60, claims...)
	w.noFailures(t)
}

// stalledBurst raises cheap for n NodeClaims whose Launches wait for
// Machines, behind a MachineSet that makes none until told (bindNext).
func stalledBurst(t *testing.T, n int) (*world, []string, *clusterv1.MachineSet) {
	t.Helper()
	w := newWorld(t, map[string]int32{"cheap": 0}, nil, nil)
	w.reconcile()
	var claims []string
	for range n {
		claims = append(claims, w.newClaim())
	}
	w.now = w.now.Add(time.Second)
	for _, c := range claims {
		_ = w.create(c) // raised: Launch waits for a Machine
	}
	if got := w.replicas("cheap"); got != int32(n) {
		t.Fatalf("cheap has %d replicas for %d NodeClaims, want %d", got, n, n)
	}
	w.stalled["cheap"] = true
	w.runMachineSets() // Cluster API's MachineSet, which makes no Machine yet
	sets := w.machineSetsOf(w.md("cheap"))
	if len(sets) != 1 {
		t.Fatalf("cheap has %d MachineSets, want 1", len(sets))
	}
	return w, claims, sets[0]
}

// bindNext lets the stalled MachineSet make one Machine after, and runs the
// pass its creation starts; want of the claims must be bound then.
func (w *world) bindNext(t *testing.T, set *clusterv1.MachineSet, after time.Duration, claims []string, want int) {
	t.Helper()
	w.now = w.now.Add(after)
	w.acting.Store(true)
	w.makeMachine(set)
	w.acting.Store(false)
	w.hub.Sync()
	w.reconcile()
	w.hub.Sync()
	if bound := w.boundClaims(claims); bound != want {
		t.Fatalf("after the MachineSet's next Machine: %d of the NodeClaims bound, want %d", bound, want)
	}
}

// passAfter lets d pass, runs the controller and lets the cache catch up.
func (w *world) passAfter(d time.Duration) {
	w.now = w.now.Add(d)
	w.reconcile()
	w.hub.Sync()
}

// boundClaims counts the claims with a bound Machine.
func (w *world) boundClaims(claims []string) int {
	n := 0
	for _, c := range claims {
		if w.machineOf(c) != nil {
			n++
		}
	}
	return n
}

// A reservation a Machine took up stays listed for up to TakeUpDelay. When
// that Machine is released in the meantime (its launch failed within
// seconds, as an exhausted offering's does: marked, the lowering not yet
// written), the NodeClaim's next Launch must not wait on the listed
// reservation, for which no Machine will be made: it reserves again at once.
func TestALaunchDoesNotWaitOnAReservationItsReleasedMachineTookUp(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0}, nil, nil)
	w.reconcile()
	a := w.newClaim()
	w.now = w.now.Add(time.Second)
	_ = w.create(a) // raised on cheap
	w.runMachineSets()
	w.hub.Sync()
	w.reconcile() // binds the Machine to a
	w.hub.Sync()
	w.reconcile() // the take-up waits for TakeUpDelay
	w.hub.Sync()
	m := w.machineOf(a)
	if m == nil {
		t.Fatal("setup: no Machine bound to the NodeClaim")
	}
	if got := w.reservations(a); len(got) != 1 {
		t.Fatalf("setup: want %s's taken-up reservation still listed, got %v", a, got)
	}
	// Released as a failed launch is, up to the lowering.
	w.acting.Store(true)
	m.Annotations[clusterv1.DeleteMachineAnnotation] = "karpenter-clusterapi: NodeClaim " + a + " failed to launch"
	w.must(w.hub.API.Update(context.Background(), m))
	w.acting.Store(false)
	w.hub.Sync()
	before := w.replicas("cheap")
	_ = w.create(a)
	if got := w.replicas("cheap"); got != before+1 {
		t.Fatalf("NodeClaim %s's Launch left cheap at %d replicas (from %d): it waited on the reservation its released Machine took up", a, got, before)
	}
	w.mustLaunch(t, 60, a)
	w.noFailures(t)
}
