package machinedeployment

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// recentTTL bounds how long a binding is remembered: far longer than the
// cache takes to show it, short enough to forget Machines that went away.
const recentTTL = 2 * time.Minute

// recentBindings holds NodeClaim <-> Machine bindings written by this
// process that the cache may not show yet.
type recentBindings struct {
	mu       sync.Mutex
	byClaim  map[string]recentBinding
	machines map[string]string // "<ns>/<machine>" -> claim
}

type recentBinding struct {
	machine string // "<ns>/<machine>"
	at      time.Time
	// md and created are the Machine's MachineDeployment and creation
	// time: what a lost Machine's replica is reclaimed with (lostMachines).
	md      types.NamespacedName
	created time.Time
}

func (r *recentBindings) add(claim string, m *clusterv1.Machine, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byClaim == nil {
		r.byClaim, r.machines = map[string]recentBinding{}, map[string]string{}
	}
	machine := m.Namespace + "/" + m.Name
	r.byClaim[claim] = recentBinding{machine: machine, at: now, created: m.CreationTimestamp.Time,
		md: types.NamespacedName{Namespace: m.Namespace, Name: m.Labels[clusterv1.MachineDeploymentNameLabel]}}
	r.machines[machine] = claim
	for c, b := range r.byClaim { // forget what is old
		if now.Sub(b.at) > recentTTL {
			delete(r.byClaim, c)
			delete(r.machines, b.machine)
		}
	}
}

// claimMachine returns the Machine ("<ns>/<machine>") this process bound to
// the claim lately, if any.
func (r *recentBindings) claimMachine(claim string, now time.Time) (string, bool) {
	b, ok := r.binding(claim, now)
	return b.machine, ok
}

// binding returns the binding this process made for the claim lately.
func (r *recentBindings) binding(claim string, now time.Time) (recentBinding, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.byClaim[claim]
	if !ok || now.Sub(b.at) > recentTTL {
		return recentBinding{}, false
	}
	return b, true
}

// forget drops the claim's binding: its Machine went away, and the claim
// may be bound again.
func (r *recentBindings) forget(claim string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b, ok := r.byClaim[claim]; ok {
		delete(r.byClaim, claim)
		delete(r.machines, b.machine)
	}
}

// machineBound reports whether this process bound the Machine lately.
func (r *recentBindings) machineBound(machine string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.machines[machine]
	return ok
}

// releasedMachines holds Machines this process marked for deletion lately,
// until the cache shows the mark: a Launch retried at once after a failed
// launch must not find the failed Machine still bound (the cache lags) and
// fail it again, in a loop.
type releasedMachines struct {
	mu sync.Mutex
	at map[string]time.Time // "<ns>/<machine>" -> when marked
}

func (r *releasedMachines) add(machine string, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at == nil {
		r.at = map[string]time.Time{}
	}
	r.at[machine] = now
	for m, t := range r.at {
		if now.Sub(t) > recentTTL {
			delete(r.at, m)
		}
	}
}

func (r *releasedMachines) has(machine string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.at[machine]
	return ok && now.Sub(t) <= recentTTL
}

// lostTTL bounds how long after its loss a Machine's replica is reclaimed
// by the claim it was bound to: well within OrphanGrace, after which the
// controller gives an unused replica back (a reclaim written on a cache
// that missed that give-back is refused at the write: see opReclaim).
const lostTTL = OrphanGrace / 2

// lostMachines remembers, per NodeClaim, the Machine bound to it that
// someone else deleted before it launched: the MachineSet removing an
// excess Machine (Cluster API's MachineSet makes one too many when a create
// outlasts its reconcile timeout, and removes a Node-less one first, often
// the one just bound), a MachineHealthCheck, a person. The replica raised
// for the claim is still Karpenter's and no NodeClaim uses it: the claim's
// next reservation takes it (opReclaim) instead of raising another, which
// would make one Machine and one instance more than there are NodeClaims
// (conformance run G, Utilization: 101 nodes for 100 pods).
type lostMachines struct {
	mu      sync.Mutex
	byClaim map[string]lostMachine
}

type lostMachine struct {
	md      types.NamespacedName
	created time.Time // the lost Machine's creation: the reservation's raise time
	at      time.Time // when it was seen lost
}

func (l *lostMachines) add(claim string, md types.NamespacedName, created, now time.Time) {
	if md.Name == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byClaim == nil {
		l.byClaim = map[string]lostMachine{}
	}
	if _, ok := l.byClaim[claim]; ok {
		return // seen first earlier: the replica is as old as that
	}
	l.byClaim[claim] = lostMachine{md: md, created: created, at: now}
	for c, x := range l.byClaim {
		if now.Sub(x.at) > lostTTL {
			delete(l.byClaim, c)
		}
	}
}

// reclaimable returns the raise time to reclaim the claim's lost replica on
// md with, if the claim lost a Machine of md within lostTTL.
func (l *lostMachines) reclaimable(claim string, md types.NamespacedName, now time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	x, ok := l.byClaim[claim]
	if !ok || x.md != md || now.Sub(x.at) > lostTTL {
		return time.Time{}, false
	}
	return x.created, true
}

func (l *lostMachines) forget(claim string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.byClaim, claim)
}
