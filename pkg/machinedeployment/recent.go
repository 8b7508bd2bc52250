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
