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
	cancel context.CancelFunc
	done   chan struct{}

	mu         sync.Mutex
	samples    int
	errors     int
	violations []string
}

// Sample starts sampling the pools.
func Sample(w *world.World, interval time.Duration, pools ...string) *Sampler {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sampler{cancel: cancel, done: make(chan struct{})}
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
					if c.Machines > c.NodeClaims {
						s.violations = append(s.violations, fmt.Sprintf("%s pool %s: %d Machines > %d NodeClaims (%v)",
							time.Now().Format("15:04:05.000"), pool, c.Machines, c.NodeClaims, c.MachineNames))
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
