package leader

import (
	"context"
	"errors"
	"os"
	"sync"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
)

// A standby that could not reach the workload cluster for longer than the
// renew deadline restarts itself when the cluster answers again.
//
// Why: the standby's informers (Karpenter core's cache of the workload
// cluster: Pods, Nodes, NodeClaims, NodePools) back off while the API
// server is down, up to 30 s between attempts (60 s with jitter), and core
// offers no way to change that. The standby is the replica that takes over
// after such an outage (the leader lost its Lease and exited), so it would
// lead on caches that stay stale for up to a minute after the return, and
// pending pods would wait that long. A fresh process lists everything at
// once. It replaces this one in place (exec: same container, no restart
// back-off), before it leads, so nothing is interrupted.

// outageWatch wraps the Lease lock and reports when the API server answers
// again after being unreachable for longer than threshold.
type outageWatch struct {
	resourcelock.Interface
	threshold time.Duration
	now       func() time.Time
	// back is called, once per outage, with how long it lasted.
	back func(down time.Duration)

	mu    sync.Mutex
	since time.Time // first failure of the current outage; zero when reachable
}

func (o *outageWatch) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	rec, raw, err := o.Interface.Get(ctx)
	o.observe(err)
	return rec, raw, err
}

func (o *outageWatch) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	err := o.Interface.Update(ctx, r)
	o.observe(err)
	return err
}

func (o *outageWatch) observe(err error) {
	o.mu.Lock()
	now := o.now()
	switch {
	case unreachable(err):
		if o.since.IsZero() {
			o.since = now
		}
		o.mu.Unlock()
		return
	case err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err):
		// An answer, but not a usable one: neither up nor down.
		o.mu.Unlock()
		return
	}
	since := o.since
	o.since = time.Time{}
	o.mu.Unlock()
	if !since.IsZero() && now.Sub(since) > o.threshold {
		o.back(now.Sub(since))
	}
}

// unreachable is true for errors that mean the API server did not answer.
func unreachable(err error) bool {
	return hub.Unreachable(err) || errors.Is(err, context.DeadlineExceeded)
}

// reexec replaces the process with a fresh run of the same binary, with the
// same arguments and environment.
func reexec() error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	return syscall.Exec(exe, os.Args, os.Environ())
}
