package ha

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/autonode/karpenter-clusterapi/test/world"
)

// Sampler checks, every interval while it runs, that no pool has more
// Machines than NodeClaims: a Machine exists only for a NodeClaim (created
// before it, deleted after it), so an excess is a Machine nobody will
// account for, i.e. an extra node.
type Sampler struct {
	// LiveOnly leaves Machines being deleted out of the comparison. The
	// failover test counts every Machine (nothing there deletes one). A
	// soak's faults do: someone else deletes a Karpenter Machine and its
	// MachineSet replaces it at once while the old one drains; a launch
	// attempt that failed is deleted while the next offering's Machine is
	// created in the same Create. A Machine on its way out is not capacity
	// anybody can lose track of, and every settle still counts all of them.
	LiveOnly bool
	// Tolerance, when set, records an excess only once it has lasted
	// longer than this, continuously, in one pool. The failover test
	// tolerates none. A soak's other actors make excesses the protocol
	// takes back after a grace period: someone else deletes a Karpenter
	// Machine, its MachineSet makes an unbound one in its place at once,
	// and the provider gives that replica back after OrphanGrace (30 s)
	// with that Machine; when the NodeClaim goes first, the unbound
	// Machine is one too many for those seconds. A launch that failed
	// leaves its released Machine until the MachineSet removes it. An
	// excess that outlasts the tolerance is a Machine nobody accounts for.
	// The tolerance counts from the later of the excess's start and the
	// last time the provider could act again (Resumed): while an API
	// server is down or no replica leads, nothing gives a replica back,
	// and a new leader's grace starts afresh (its first-seen times are
	// memory, docs/design/machinedeployment-binding.md).
	Tolerance time.Duration

	cancel context.CancelFunc
	done   chan struct{}

	mu         sync.Mutex
	samples    int
	errors     int
	violations []string
	resumedAt  time.Time // the provider could last act again then
}

// Resumed tells the sampler that the provider could act again at t (an
// outage ended, a replica began to lead): an excess older than that is
// judged from t.
func (s *Sampler) Resumed(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.After(s.resumedAt) {
		s.resumedAt = t
	}
}

// Sample starts sampling the pools, counting every Machine.
func Sample(w *world.World, interval time.Duration, pools ...string) *Sampler {
	return sample(w, interval, false, pools)
}

// SampleLive starts sampling the pools, counting the Machines not being
// deleted (see LiveOnly).
func SampleLive(w *world.World, interval time.Duration, pools ...string) *Sampler {
	return sample(w, interval, true, pools)
}

// SampleLiveTolerant is SampleLive with a Tolerance.
func SampleLiveTolerant(w *world.World, interval, tolerance time.Duration, pools ...string) *Sampler {
	return sampleWith(w, interval, true, tolerance, pools)
}

func sample(w *world.World, interval time.Duration, liveOnly bool, pools []string) *Sampler {
	return sampleWith(w, interval, liveOnly, 0, pools)
}

func sampleWith(w *world.World, interval time.Duration, liveOnly bool, tolerance time.Duration, pools []string) *Sampler {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sampler{LiveOnly: liveOnly, Tolerance: tolerance, cancel: cancel, done: make(chan struct{})}
	excessSince := map[string]time.Time{} // pool -> since when it has had an excess
	go func() {
		defer close(s.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			for _, pool := range pools {
				c, err := Count(ctx, w, pool, "")
				s.mu.Lock()
				if err != nil {
					s.errors++ // an API server may be down: no sample
				} else {
					s.samples++
					machines := c.Machines
					if liveOnly {
						machines -= c.MachinesDeleting
					}
					if machines <= c.NodeClaims {
						delete(excessSince, pool)
					} else {
						since, ok := excessSince[pool]
						if !ok {
							since = time.Now()
							excessSince[pool] = since
						}
						judged := since
						if s.resumedAt.After(judged) {
							judged = s.resumedAt
						}
						if lasted := time.Since(since); time.Since(judged) >= s.Tolerance {
							s.violations = append(s.violations, fmt.Sprintf("%s pool %s: %d Machines (%d being deleted) > %d NodeClaims for %s (%v)",
								time.Now().Format("15:04:05.000"), pool, c.Machines, c.MachinesDeleting, c.NodeClaims, lasted.Round(time.Second), c.MachineNames))
						}
					}
				}
				s.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// Stop stops sampling and returns the number of samples and the violations.
func (s *Sampler) Stop() (int, []string) {
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples, append([]string(nil), s.violations...)
}

// Violations returns the violations so far.
func (s *Sampler) Violations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.violations...)
}
