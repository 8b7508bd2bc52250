package machinedeployment

import (
	"sync"
	"time"
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
}

func (r *recentBindings) add(claim, machine string, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byClaim == nil {
		r.byClaim, r.machines = map[string]recentBinding{}, map[string]string{}
	}
	r.byClaim[claim] = recentBinding{machine: machine, at: now}
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
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.byClaim[claim]
	if !ok || now.Sub(b.at) > recentTTL {
		return "", false
	}
	return b.machine, true
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
