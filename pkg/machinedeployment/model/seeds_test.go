package model

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
)

// Deterministic scenarios for what random seeds of TestBindingModel found
// (docs/design/machinedeployment-binding.md, "Open findings"), one each.
// Each fails on the code before its fix.

// bindAsEarlierProcess binds a Machine to a claim the way a provider process
// before a restart did: the new process does not remember it.
func (w *world) bindAsEarlierProcess(machine, claim string) {
	w.t.Helper()
	w.acting.Store(true)
	defer w.acting.Store(false)
	for _, m := range w.machines() {
		if m.Name == machine {
			m.Annotations[v1alpha1.NodeClaimAnnotation] = claim
			w.must(w.hub.API.Update(context.Background(), &m))
			return
		}
	}
	w.t.Fatalf("no Machine %s", machine)
}

// Model seeds 25 and 37: a stranded reservation gives its replica back with
// an unbound Machine picked from the cache; a Machine bound since (by the
// process before a restart, which the cache does not show yet) is not that
// Machine, whatever the cache says.
func TestAStrandedReservationNeverMarksAMachineBoundSinceTheCachesRead(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.reconcile() // the provider has counted its (no) replicas
	a, b := w.newClaim(), w.newClaim()
	_, _ = w.create(a), w.create(b) // two replicas raised, no Machine yet
	w.runMachineSets()
	// Both Machines boot before anyone binds them: Nodes that run (the
	// spoke shows none awaiting registration), so neither is bindable and
	// both reservations strand.
	w.runInfrastructure()
	w.runInfrastructure()
	w.hub.Sync()
	w.hub.SetLag(true)
	var ms []string
	for _, m := range w.machines() {
		ms = append(ms, m.Name)
	}
	if len(ms) != 2 {
		t.Fatalf("want 2 Machines, got %v", ms)
	}
	// The process before a restart bound the Machine the victim order puts
	// first (same age: the greater name) to a; the cache does not show it.
	w.bindAsEarlierProcess(ms[1], a)
	w.restartLagging()
	w.now = w.now.Add(machinedeployment.OrphanGrace + time.Second)
	w.reconcile() // b is stranded: its victim is not a's Machine
	w.noFailures(t)
	w.hub.SetLag(false)
	w.rounds(60, func() bool { return false })
	w.noFailures(t)
	if m := w.machineOf(a); m == nil || m.Name != ms[1] {
		t.Errorf("NodeClaim %s lost its Machine %s: bound now to %v", a, ms[1], m)
	}
}

// reservations lists the MachineDeployments holding a reservation for claim
// (API server's truth).
func (w *world) reservations(claim string) []string {
	var out []string
	for _, md := range w.mds {
		if pending, _ := hub.PendingNodeClaims(w.md(md)); hasKey(pending, claim) {
			out = append(out, md)
		}
	}
	return out
}

// Model seed 33: a launch failure that a process before a restart handled
// (Machine marked, the claim raised for on the next offering) is not
// handled again on a cache that still shows the Machine bound and
// unmarked: that chose afresh and raised a second replica for the claim,
// on another MachineDeployment, and two Machines were bound to it.
func TestAFailedLaunchHandledBeforeARestartIsNotFailedAgain(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.reconcile()
	w.exhausted["cheap"] = true
	a := w.newClaim()
	_ = w.create(a) // raised on cheap
	w.runMachineSets()
	w.hub.Sync()
	w.reconcile() // binds the new Machine to a
	w.hub.Sync()
	w.now = w.now.Add(time.Minute)
	w.reconcile()         // drops a's reservation: it is bound
	w.runInfrastructure() // its launch fails
	w.hub.Sync()
	w.hub.SetLag(true) // the cache stops here: bound, unmarked, failed
	_ = w.create(a)    // released, raised again on dear
	if got := w.reservations(a); len(got) != 1 || got[0] != "dear" {
		t.Fatalf("NodeClaim %s reserved on %v after its launch failed on cheap, want [dear]", a, got)
	}
	w.restartLagging()
	_ = w.create(a) // the new process: the cache still shows the failed Machine bound
	if got := w.reservations(a); len(got) != 1 {
		t.Fatalf("NodeClaim %s reserved on %v after a restart, want one MachineDeployment", a, got)
	}
	w.hub.SetLag(false)
	w.mustLaunch(t, 20, a)
	w.noFailures(t)
}

// Model seed 33: a claim reserved on two MachineDeployments is bound on one
// by this process; until the cache shows it, the other's reconcile takes
// that binding (made on another MachineDeployment) as the claim's, and
// binds no second Machine.
func TestABindingOnAnotherMachineDeploymentSettlesTheClaim(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.reconcile()
	a := w.newClaim()
	_ = w.create(a) // raised on cheap
	// A reservation for a on dear too, as two processes' choices left it.
	w.acting.Store(true)
	dear := w.md("dear")
	dear.Spec.Replicas = ptr.To(ptr.Deref(dear.Spec.Replicas, 0) + 1)
	pending, _ := hub.PendingNodeClaims(dear)
	pending[a] = w.now.UTC().Truncate(time.Second)
	hub.SetPendingNodeClaims(dear, pending)
	dear.Annotations[machinedeployment.OwnedReplicasAnnotation] = "1"
	w.must(w.hub.API.Update(context.Background(), dear))
	w.acting.Store(false)
	w.runMachineSets()
	w.hub.Sync()
	w.hub.SetLag(true) // the cache will not show the binding below
	w.reconcile()      // cheap binds its Machine to a; dear must not bind
	w.noFailures(t)
	w.hub.SetLag(false)
	w.rounds(60, func() bool { return false })
	w.noFailures(t)
}

// Model seeds 20 and 44: a NodeClaim whose Machine was released (its launch
// failed) is raised for again before the MachineSet removed that Machine;
// the released Machine still carries the claim's annotation but does not
// settle the new reservation: the claim gets a Machine of its own.
func TestAReleasedMachineDoesNotSettleTheClaimsNewReservation(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.reconcile()
	a := w.newClaim()
	_ = w.create(a) // raised on cheap
	w.runMachineSets()
	w.hub.Sync()
	w.reconcile() // binds the new Machine to a
	m := w.machineOf(a)
	if m == nil {
		t.Fatal("no Machine bound")
	}
	w.hub.Sync()
	w.now = w.now.Add(time.Minute)
	w.reconcile() // drops a's reservation: it is bound
	w.hub.Sync()
	// The launch fails and is given up: the Machine is released.
	w.acting.Store(true) // setup, not a decision under test
	w.failLaunch(m.Name)
	w.must(w.provider.Release(context.Background(), a, m))
	w.acting.Store(false)
	w.restartLagging() // and forgotten, as fail does
	w.hub.Sync()
	_ = w.create(a) // raised on cheap again; the MachineSet keeps the released Machine
	w.runMachineSets()
	w.hub.Sync()
	w.now = w.now.Add(15 * time.Second) // past cleanupDelay, within OrphanGrace
	w.reconcile()
	if got := w.reservations(a); len(got) != 1 {
		t.Fatalf("NodeClaim %s's new reservation was dropped (reserved on %v) while no Machine of its own is bound", a, got)
	}
	w.mustLaunch(t, 60, a)
	w.noFailures(t)
}

// Model seeds 30 and 48: a NodeClaim deleted while its reservation is still
// listed beside its bound Machine (the controller drops the entry of a
// bound claim only with a later write, cleanupDelay) gave its one replica
// back twice: with the Machine (Release) and once more for the reservation
// when the claim was gone. The second give-back took the replica of another
// NodeClaim's Machine, and the MachineSet removed a node in use.
func TestAReleasedClaimsReplicaIsGivenBackOnce(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.reconcile()
	a, b := w.newClaim(), w.newClaim()
	_, _ = w.create(a), w.create(b) // two replicas raised on cheap
	w.runMachineSets()
	w.hub.Sync()
	w.reconcile() // binds both; dropping their entries waits for cleanupDelay
	w.runInfrastructure()
	w.hub.Sync()
	_, _ = w.create(a), w.create(b)
	if !w.launched(a, b)() {
		t.Fatalf("NodeClaims %s, %s not launched", a, b)
	}
	if got := w.reservations(a); len(got) != 1 {
		t.Fatalf("setup: want %s's reservation still listed beside its bound Machine, got %v", a, got)
	}
	mb := w.machineOf(b)
	w.startDeleting(a)
	w.rounds(60, func() bool { return false })
	w.noFailures(t)
	if m := w.machineOf(b); m == nil || m.Name != mb.Name {
		t.Errorf("NodeClaim %s lost its Machine %s (bound now: %v)", b, mb.Name, m)
	}
	if got, live := w.replicas("cheap"), w.liveMachines("cheap"); got != 1 || live != 1 {
		t.Errorf("cheap has %d replicas and %d live Machines, want 1 and 1 (b's)", got, live)
	}
	if n, _ := owned(w.md("cheap")); n != 1 {
		t.Errorf("cheap owns %d replicas, want 1 (b's)", n)
	}
}

// failLaunch makes a Machine's infrastructure machine fail, as CAPA
// reports InsufficientInstanceCapacity.
func (w *world) failLaunch(machine string) {
	w.t.Helper()
	am := &infrav1.AWSMachine{}
	w.must(w.hub.API.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: machine}, am))
	am.Status.FailureReason = ptr.To("InsufficientInstanceCapacity")
	am.Status.FailureMessage = ptr.To("We currently do not have sufficient capacity")
	w.must(w.hub.API.Update(context.Background(), am))
}

// Model seed 7: a released Machine that its MachineSet keeps, because
// someone raised the replicas as it was released, stayed for ever: its
// NodeClaim never finished terminating, and the provider released it again
// at every pass, an op that changed nothing but held back giving spare
// replicas back (nine owned replicas no NodeClaim used). The provider now
// deletes such a Machine itself once the MachineSet has settled.
func TestAReleasedMachineItsMachineSetKeepsIsDeleted(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.reconcile()
	a, b := w.newClaim(), w.newClaim()
	_, _ = w.create(a), w.create(b)
	w.mustLaunch(t, 20, a, b)
	ma := w.machineOf(a)
	// a is deleted; as its Machine is released, someone raises cheap by
	// one: the MachineSet keeps the marked Machine.
	w.startDeleting(a)
	w.acting.Store(true)
	lookup := hub.NewLookup(w.hub.Hub, nil)
	m, err := lookup.Find(context.Background(), a, nil, "")
	w.must(err)
	w.must(w.provider.Release(context.Background(), a, m))
	w.acting.Store(false)
	w.setReplicas("cheap", +1)
	// Someone else deletes b's Machine, and Karpenter deletes b: its
	// replica is spare, to be given back with the Machine made in its place.
	w.healthCheckDelete(w.machineOf(b))
	w.startDeleting(b)
	w.rounds(120, func() bool { return len(w.claims) == 0 })
	w.rounds(60, func() bool { return false })
	w.noFailures(t)
	if _, ok := w.claims[a]; ok {
		t.Errorf("NodeClaim %s still terminating: its released Machine %s was kept", a, ma.Name)
	}
	md := w.md("cheap")
	if got, ok := owned(md); !ok || got != 0 {
		t.Errorf("cheap owns %d replicas with no NodeClaim left (released: %s)", got, md.Annotations[hub.ReleasedMachinesAnnotation])
	}
	if got, live := w.replicas("cheap"), w.liveMachines("cheap"); got != 1 || live != 1 {
		t.Errorf("cheap has %d replicas and %d live Machines, want 1 and 1 (the one someone else raised)", got, live)
	}
}

// Found by the soak (make soak, seed 1795701443152048057): a release and a
// raise for another NodeClaim on the same MachineDeployment cancel out in
// the MachineSet's eyes (replicas -1 +1): it keeps the released Machine and
// makes none for the raise. The released Machine's NodeClaim never finished
// terminating, and the raise was stranded, dropped as if someone else had
// taken its replica (opLost) and raised again: the kept Machine's replica
// passed to "someone else" for good, an unbound Machine no one owns. The
// provider deletes the kept Machine well within OrphanGrace, so the
// MachineSet's replacement serves the raise.
// releaseAndRaiseCancelOut launches NodeClaim a on cheap, then raises for a
// new claim c as a is released: the MachineSet keeps a's marked Machine and
// makes none for c.
func releaseAndRaiseCancelOut(t *testing.T) (*world, string, string) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	// cheap is the one member of its offering: c waits there for the
	// kept Machine to go (the model's moveAfter is shorter than that wait).
	w.provider.MoveAfter = time.Hour
	w.reconcile()
	a := w.newClaim()
	w.mustLaunch(t, 20, a)
	w.hub.Sync()
	c := w.newClaim()
	_ = w.create(c) // raised: replicas 2
	w.startDeleting(a)
	_ = w.remove(a) // released: replicas 1, the MachineSet keeps a's marked Machine
	w.runMachineSets()
	return w, a, c
}

func TestAReleaseAndARaiseThatCancelOutServeBoth(t *testing.T) {
	w, a, c := releaseAndRaiseCancelOut(t)
	w.rounds(90, func() bool { _, ok := w.claims[a]; return w.launched(c)() && !ok })
	w.rounds(60, func() bool { return false })
	w.noFailures(t)
	if _, ok := w.claims[a]; ok {
		t.Errorf("NodeClaim %s still terminating: its released Machine was kept", a)
	}
	if !w.launched(c)() {
		t.Errorf("NodeClaim %s not launched", c)
	}
	md := w.md("cheap")
	n, _ := owned(md)
	if r, live := w.replicas("cheap"), w.liveMachines("cheap"); r != 1 || live != 1 || n != 1 {
		t.Errorf("cheap has %d replicas, %d live Machines, owns %d: want 1, 1, 1 (c's); a replica passed to no one", r, live, n)
	}
}

// mustLaunch runs up to n rounds until the claims are launched, and fails
// the test when they are not.
func (w *world) mustLaunch(t *testing.T, n int, claims ...string) {
	t.Helper()
	w.rounds(n, w.launched(claims...))
	if !w.launched(claims...)() {
		t.Fatalf("NodeClaims %v not launched in %d rounds", claims, n)
	}
}

// Conformance (Karpenter's StaticCapacity "should replace drifted nodes",
// MachineDeployment mode): the same cancel-out as above, but the
// controller's next pass comes only after OrphanGrace (a provider busy with
// ten replacements at once), when the reservation is stranded and the kept
// Machine due in the same pass. The reservation was dropped as lost
// (opLost: owned-1, replicas unchanged) with no one else writing replicas,
// the kept Machine was deleted, and the MachineSet's new Machine had no
// NodeClaim: a node no one asked for, for ever. A kept released Machine
// stands in for the reservation's replica: the reservation waits for it to
// go.
func TestAReservationAKeptReleasedMachineStandsInForIsNotLost(t *testing.T) {
	w, a, c := releaseAndRaiseCancelOut(t)
	w.hub.Sync()
	w.now = w.now.Add(machinedeployment.OrphanGrace + time.Second)
	w.reconcile() // stranded and kept at once
	w.noFailures(t)
	w.rounds(90, func() bool { _, ok := w.claims[a]; return w.launched(c)() && !ok })
	w.rounds(60, func() bool { return false })
	w.noFailures(t)
	if !w.launched(c)() {
		t.Errorf("NodeClaim %s not launched", c)
	}
	md := w.md("cheap")
	n, _ := owned(md)
	if r, live := w.replicas("cheap"), w.liveMachines("cheap"); r != 1 || live != 1 || n != 1 {
		t.Errorf("cheap has %d replicas, %d live Machines, owns %d: want 1, 1, 1 (c's); a replica passed to no one", r, live, n)
	}
}

// Not a seed: Cluster API writes a new Machine every few seconds while it
// boots, and a loaded hub's cache lags by as much, so a binding decided on
// the cache can conflict pass after pass (a conformance run bound a Machine
// 20 s after it was made, when its Node had waited unregistered for 10 s
// and the pods it was for had gone elsewhere). A binding that conflicts is
// decided again on a live read, in the same pass.
func TestAMachineClusterAPIWritesWhileItBootsIsBoundInThePassThatFindsIt(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.reconcile()
	a := w.newClaim()
	_ = w.create(a) // a replica raised, no Machine yet
	w.runMachineSets()
	w.hub.Sync()
	w.hub.SetLag(true)
	// Cluster API's next write (the instance's providerID) lands after the
	// cache's read.
	w.runInfrastructure()
	w.reconcile()
	w.noFailures(t)
	m := w.machineOf(a)
	if m == nil {
		t.Fatalf("NodeClaim %s has no Machine after the pass that found its Machine (the binding conflicted and waited for another pass)", a)
	}
	// A Machine whose Node was registered since the cache's read is not
	// bound on the live read either (the bind patch's nodeRef precondition).
	b := w.newClaim()
	_ = w.create(b)
	w.hub.SetLag(false)
	w.runMachineSets()
	w.hub.Sync()
	w.hub.SetLag(true)
	w.runInfrastructure() // providerID
	w.runInfrastructure() // a Node
	for _, m := range w.machines() {
		if bound(&m) == "" && m.Status.NodeRef.IsDefined() {
			w.registerNode(context.Background(), m.Status.NodeRef.Name) // someone's: runs workloads
		}
	}
	w.reconcile()
	w.noFailures(t)
	if m := w.machineOf(b); m != nil {
		t.Errorf("NodeClaim %s bound to Machine %s, whose Node runs (it got one since the cache's read)", b, m.Name)
	}
}

func hasKey[V any](m map[string]V, k string) bool { _, ok := m[k]; return ok }
