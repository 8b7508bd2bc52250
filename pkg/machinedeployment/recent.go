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

// claimBound reports whether this process bound a Machine to the claim lately.
func (r *recentBindings) claimBound(claim string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.byClaim[claim]
	return ok && now.Sub(b.at) <= recentTTL
}

// machineBound reports whether this process bound the Machine lately.
func (r *recentBindings) machineBound(machine string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.machines[machine]
	return ok
}
