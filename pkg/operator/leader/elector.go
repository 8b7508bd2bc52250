package leader

import (
	"context"
	"fmt"
	"reflect"
	"runtime"
	"sort"
	"sync"
	"time"

	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

func (g *Gate) newElector(lock resourcelock.Interface) (*leaderelection.LeaderElector, error) {
	var once sync.Once
	return leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: g.settings.LeaseDuration,
		RenewDeadline: g.settings.RenewDeadline,
		RetryPeriod:   g.settings.RetryPeriod,
		// Released by electorRunnable once the leader-only runnables have
		// returned: a rolling update hands over at once.
		ReleaseOnCancel: true,
		Name:            g.settings.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { once.Do(func() { close(g.elected) }) },
			// Run's return tells a lost Lease from a release; see electorRunnable.
			OnStoppedLeading: func() {},
		},
	})
}

// electorRunnable runs the election on every replica (it needs no leader).
type electorRunnable struct {
	gate    *Gate
	elector *leaderelection.LeaderElector
}

// NeedLeaderElection is false: the elector is what elects.
func (*electorRunnable) NeedLeaderElection() bool { return false }

// Start campaigns, leads until ctx ends, then waits for the leader-only
// runnables to return before releasing the Lease. A Lease lost while
// leading ends the process at once.
func (e *electorRunnable) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("leader-election").WithValues("lease", e.gate.settings.Namespace+"/"+e.gate.settings.Name)
	// Not ctx itself: the Lease must outlive the leader-only runnables.
	electionCtx, release := context.WithCancel(context.WithoutCancel(ctx))
	defer release()
	go func() {
		select {
		case <-ctx.Done():
		case <-electionCtx.Done():
			return
		}
		e.gate.stopAndWait()
		logger.Info("leader-only controllers stopped; releasing the lease")
		release()
	}()
	go func() {
		select {
		case <-e.gate.elected:
			logger.Info("leading: starting the leader-only controllers", "identity", e.elector.GetLeader())
		case <-electionCtx.Done():
		}
	}()
	e.elector.Run(electionCtx)
	if electionCtx.Err() == nil {
		// Renewing failed for the renew deadline: another replica may lead
		// by now, so nothing here may act any more.
		logger.Error(nil, "lost the leader lease; exiting so that only the new leader acts")
		e.gate.exit(1)
	}
	return nil
}

// gated is a leader-only runnable that the manager starts on every replica
// and that waits for this replica to lead.
type gated struct {
	manager.Runnable
	gate *Gate
}

// NeedLeaderElection is false so that the manager starts it at once; it
// waits for the Gate's election itself.
func (*gated) NeedLeaderElection() bool { return false }

func (r *gated) Start(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-r.gate.elected:
	}
	if !r.gate.enter(r) {
		return nil // stopping: the Lease is about to be released
	}
	defer r.gate.leave(r)
	return r.Runnable.Start(ctx)
}

// name names the runnable for the logs: a controller's name, else its type.
func (r *gated) name() string {
	v := reflect.ValueOf(r.Runnable)
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			break
		}
		v = v.Elem()
	}
	if v.Kind() == reflect.Struct {
		// A field of the struct itself: a promoted one may sit behind a
		// nil embedded pointer, which reflect cannot read.
		if f, ok := v.Type().FieldByName("Name"); ok && len(f.Index) == 1 && f.Type.Kind() == reflect.String {
			if name := v.Field(f.Index[0]).String(); name != "" {
				return name
			}
		}
	}
	return fmt.Sprintf("%T", r.Runnable)
}

// enter records a leader-only runnable starting; false once stopping.
func (g *Gate) enter(r *gated) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopping {
		return false
	}
	if g.running == nil {
		g.running = map[*gated]struct{}{}
	}
	g.running[r] = struct{}{}
	return true
}

func (g *Gate) leave(r *gated) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.running, r)
	if g.stopping && len(g.running) == 0 {
		g.idleOnce.Do(func() { close(g.idle) })
	}
}

// stillRunning names the leader-only runnables that have not returned.
func (g *Gate) stillRunning() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	names := make([]string, 0, len(g.running))
	for r := range g.running {
		names = append(names, r.name())
	}
	sort.Strings(names)
	return names
}

// stopAndWait refuses further leader-only runnables and waits until those
// running have returned. The Lease stays held meanwhile, however long it
// takes: releasing it while one still acts would let two leaders act. A
// stop that lasts is reported, first with the runnables still running,
// then with every goroutine's stack, so that whoever waits for the
// handover (or kills the process) can see what held it.
func (g *Gate) stopAndWait() {
	g.mu.Lock()
	g.stopping = true
	if len(g.running) == 0 {
		g.idleOnce.Do(func() { close(g.idle) })
	}
	g.mu.Unlock()
	start := time.Now()
	names := time.NewTimer(g.slowStop)
	defer names.Stop()
	stacks := time.NewTimer(2 * g.slowStop)
	defer stacks.Stop()
	for {
		select {
		case <-g.idle:
			return
		case <-names.C:
			g.log.Info("leader-only controllers still stopping; the lease is released once they return",
				"after", time.Since(start).Round(time.Millisecond).String(), "running", g.stillRunning())
		case <-stacks.C:
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			g.log.Info("leader-only controllers still stopping; the stacks of every goroutine follow",
				"after", time.Since(start).Round(time.Millisecond).String(), "running", g.stillRunning(), "stacks", string(buf))
		}
	}
}
