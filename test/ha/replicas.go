// Package ha runs the provider as a Deployment of replicas with leader
// election would, for the high-availability end-to-end tests (test/e2eha)
// and the soak (test/soak): every replica is the built binary as a
// subprocess on the same Lease of the world's workload cluster; a replica
// that exits on its own is restarted with the kubelet's crash backoff, one
// a test kills is replaced after a pod's start-up delay.
package ha

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/autonode/karpenter-clusterapi/test/e2e"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// LeaseName and LeaseNamespace: where the replicas elect (in the workload cluster).
const (
	LeaseName      = "karpenter-leader-election"
	LeaseNamespace = "default"
)

// leaderSeries is controller-runtime's gauge of client-go's election: 1 on
// the replica that leads.
const leaderSeries = `leader_election_master_status{name="` + LeaseName + `"}`

// Kubelet's restart backoff of a crashing container: 10 s, doubled per
// crash, at most 5 minutes, forgotten after 10 minutes of running.
const (
	crashBackoffInitial = 10 * time.Second
	crashBackoffMax     = 5 * time.Minute
	crashBackoffReset   = 10 * time.Minute
)

// ReplicaSet is a set of provider replicas kept running.
type ReplicaSet struct {
	bin   string
	w     *world.World
	env   []string
	args  []string
	delay time.Duration

	mu       sync.Mutex
	replicas []*replica
	stopped  bool
	done     chan struct{}
	loopDone chan struct{}
}

type replica struct {
	name     string
	p        *e2e.Provider
	started  time.Time
	crashes  int       // consecutive exits on its own
	due      time.Time // when to start again; zero while running
	killed   bool      // the current process was killed by the test
	restarts int
}

// Options shape a ReplicaSet.
type Options struct {
	Replicas int
	// Env is added to every replica's environment (after the election settings).
	Env []string
	// Args are added to every replica's arguments.
	Args []string
	// RespawnDelay is how long a killed replica takes to come back (a new
	// Pod scheduled and started); default 5 s.
	RespawnDelay time.Duration
}

// ElectionEnv turns leader election on for a replica, on LeaseName in
// LeaseNamespace; the lease timings are the product's defaults.
func ElectionEnv() []string {
	return []string{
		"DISABLE_LEADER_ELECTION=false",
		"LEADER_ELECTION_NAME=" + LeaseName,
		"LEADER_ELECTION_NAMESPACE=" + LeaseNamespace,
	}
}

// Start starts the replicas and keeps them running until Stop.
func Start(bin string, w *world.World, o Options) (*ReplicaSet, error) {
	if o.RespawnDelay == 0 {
		o.RespawnDelay = 5 * time.Second
	}
	rs := &ReplicaSet{bin: bin, w: w, env: append(ElectionEnv(), o.Env...), args: o.Args, delay: o.RespawnDelay,
		done: make(chan struct{}), loopDone: make(chan struct{})}
	for i := 0; i < o.Replicas; i++ {
		r := &replica{name: fmt.Sprintf("replica-%d", i)}
		if err := rs.start(r); err != nil {
			for _, started := range rs.replicas {
				started.p.Stop()
			}
			return nil, err
		}
		rs.replicas = append(rs.replicas, r)
	}
	go rs.supervise()
	return rs, nil
}

func (rs *ReplicaSet) start(r *replica) error {
	p, err := e2e.StartProviderWithEnv(rs.bin, rs.w, r.name+".log", rs.env, rs.args...)
	if err != nil {
		return fmt.Errorf("starting %s: %w", r.name, err)
	}
	r.p, r.started, r.due, r.killed = p, time.Now(), time.Time{}, false
	return nil
}

// supervise restarts replicas that exited, as the kubelet and the
// ReplicaSet controller would.
func (rs *ReplicaSet) supervise() {
	defer close(rs.loopDone)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-rs.done:
			return
		case <-tick.C:
		}
		rs.mu.Lock()
		now := time.Now()
		for _, r := range rs.replicas {
			if !r.p.Exited() {
				continue
			}
			if r.due.IsZero() {
				if r.killed {
					r.due = now.Add(rs.delay)
				} else {
					if now.Sub(r.started) > crashBackoffReset {
						r.crashes = 0
					}
					r.crashes++
					backoff := crashBackoffInitial << (r.crashes - 1)
					if backoff > crashBackoffMax || backoff <= 0 {
						backoff = crashBackoffMax
					}
					r.due = now.Add(backoff)
				}
				continue
			}
			if now.Before(r.due) {
				continue
			}
			if err := rs.start(r); err != nil {
				r.due = now.Add(crashBackoffInitial)
				continue
			}
			r.restarts++
		}
		rs.mu.Unlock()
	}
}

// Len is the number of replicas.
func (rs *ReplicaSet) Len() int { return len(rs.replicas) }

// Provider returns replica i's current process.
func (rs *ReplicaSet) Provider(i int) *e2e.Provider {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.replicas[i].p
}

// Restarts returns how often each replica was started again.
func (rs *ReplicaSet) Restarts() []int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	out := make([]int, len(rs.replicas))
	for i, r := range rs.replicas {
		out[i] = r.restarts
	}
	return out
}

// Leader returns the replica that reports leading, or -1.
func (rs *ReplicaSet) Leader() int {
	for i := range rs.replicas {
		p := rs.Provider(i)
		if p.Exited() {
			continue
		}
		if v, ok, err := p.Metric(leaderSeries); err == nil && ok && v == 1 {
			return i
		}
	}
	return -1
}

// WaitLeader waits until a replica other than not leads, and returns it
// and when it was first seen leading.
func (rs *ReplicaSet) WaitLeader(ctx context.Context, timeout time.Duration, not int) (int, time.Time, error) {
	leader := -1
	err := e2e.WaitFor(ctx, timeout, func(context.Context) (bool, error) {
		if l := rs.Leader(); l >= 0 && l != not {
			leader = l
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return -1, time.Time{}, fmt.Errorf("waiting for a leader (not replica %d): %w", not, err)
	}
	return leader, time.Now(), nil
}

// Kill kills replica i with SIGKILL (a node failure, an OOM kill); it is
// replaced after the respawn delay.
func (rs *ReplicaSet) Kill(i int) {
	rs.mu.Lock()
	r := rs.replicas[i]
	r.killed = true
	p := r.p
	rs.mu.Unlock()
	p.Kill()
}

// Terminate stops replica i with SIGTERM (a rolling update, a drain) and
// waits for it to exit; it is replaced after the respawn delay.
func (rs *ReplicaSet) Terminate(i int) {
	rs.mu.Lock()
	r := rs.replicas[i]
	r.killed = true
	p := r.p
	rs.mu.Unlock()
	p.Stop()
}

// Logs returns the replicas' log files.
func (rs *ReplicaSet) Logs() []string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var out []string
	for _, r := range rs.replicas {
		out = append(out, r.p.LogPath)
	}
	return out
}

// Stop stops every replica gracefully and the supervision.
func (rs *ReplicaSet) Stop() {
	rs.mu.Lock()
	if rs.stopped {
		rs.mu.Unlock()
		return
	}
	rs.stopped = true
	rs.mu.Unlock()
	close(rs.done)
	<-rs.loopDone
	var wg sync.WaitGroup
	for _, r := range rs.replicas {
		wg.Add(1)
		go func() { defer wg.Done(); r.p.Stop() }()
	}
	wg.Wait()
}
