package leader

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		s      Settings
		wantOK bool
	}{
		{"defaults", Settings{Enabled: true, LeaseDuration: DefaultLeaseDuration, RenewDeadline: DefaultRenewDeadline, RetryPeriod: DefaultRetryPeriod}, true},
		{"core's timings", Settings{Enabled: true, LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second}, true},
		{"lease not longer than renew deadline", Settings{Enabled: true, LeaseDuration: 6 * time.Second, RenewDeadline: 6 * time.Second, RetryPeriod: time.Second}, false},
		{"renew deadline within the retry jitter", Settings{Enabled: true, LeaseDuration: 8 * time.Second, RenewDeadline: 1100 * time.Millisecond, RetryPeriod: time.Second}, false},
		{"no retry period", Settings{Enabled: true, LeaseDuration: 8 * time.Second, RenewDeadline: 6 * time.Second}, false},
		{"disabled: anything goes", Settings{}, true},
	} {
		if err := tc.s.Validate(); (err == nil) != tc.wantOK {
			t.Errorf("%s: Validate() = %v, want ok %v", tc.name, err, tc.wantOK)
		}
	}
}

// activity records when each replica's leader-only runnable ran.
type activity struct {
	mu      sync.Mutex
	active  atomic.Int32
	overlap bool
	spans   map[string][2]time.Time
}

func (a *activity) runnable(name string) manager.RunnableFunc {
	return func(ctx context.Context) error {
		if a.active.Add(1) > 1 {
			a.mu.Lock()
			a.overlap = true
			a.mu.Unlock()
		}
		start := time.Now()
		<-ctx.Done()
		// Work still finishing after the stop: the Lease must not be free yet.
		time.Sleep(300 * time.Millisecond)
		a.active.Add(-1)
		a.mu.Lock()
		a.spans[name] = [2]time.Time{start, time.Now()}
		a.mu.Unlock()
		return nil
	}
}

// Two replicas on one Lease of a real API server: one runs the leader-only
// runnable; when it stops, its runnable returns before the Lease is
// released, and the other replica runs it within about a retry period.
func TestOnlyTheLeaderRunsAndAGracefulStopHandsOver(t *testing.T) {
	cluster, err := environment.Start("leader", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cluster.Stop() }()
	s := Settings{Enabled: true, Name: "test-lease", Namespace: "default", LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond}
	a := &activity{spans: map[string][2]time.Time{}}
	exits := make(chan string, 2)

	type replica struct {
		gate   *Gate
		cancel context.CancelFunc
		done   chan error
	}
	start := func(name string) *replica {
		mgr, err := ctrl.NewManager(cluster.Config, ctrl.Options{Logger: logr.Discard(), Metrics: metricsserver.Options{BindAddress: "0"}})
		if err != nil {
			t.Fatal(err)
		}
		wrapped, err := Wrap(mgr, s)
		if err != nil {
			t.Fatal(err)
		}
		g := wrapped.(*Gate)
		g.exit = func(int) { exits <- name }
		g.restart = func() error { t.Errorf("replica %s restarted itself: it saw no outage", name); return nil }
		if err := g.Add(a.runnable(name)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		r := &replica{gate: g, cancel: cancel, done: make(chan error, 1)}
		go func() { r.done <- g.Start(ctx) }()
		return r
	}
	first := start("first")
	select {
	case <-first.gate.Elected():
	case <-time.After(30 * time.Second):
		t.Fatal("the first replica never led")
	}
	second := start("second")
	defer func() { second.cancel(); <-second.done }()
	// The second stands by while the first leads.
	time.Sleep(2 * s.LeaseDuration)
	select {
	case <-second.gate.Elected():
		t.Fatal("the second replica leads beside the first")
	default:
	}

	stop := time.Now()
	first.cancel()
	select {
	case <-second.gate.Elected():
	case <-time.After(10 * time.Second):
		t.Fatal("the second replica did not take over within 10s of the first's graceful stop (Lease not released?)")
	}
	handover := time.Since(stop)
	if err := <-first.done; err != nil {
		t.Errorf("first replica: %v", err)
	}
	if err := waitFor(5*time.Second, func() bool { a.mu.Lock(); defer a.mu.Unlock(); return len(a.spans) == 1 && a.active.Load() == 1 }); err != nil {
		t.Fatalf("the second replica's runnable did not start: %v", err)
	}
	a.mu.Lock()
	if a.overlap {
		t.Error("the leader-only runnable ran on both replicas at once")
	}
	a.mu.Unlock()
	select {
	case name := <-exits:
		t.Fatalf("replica %s exited as if it had lost the Lease", name)
	default:
	}
	t.Logf("graceful handover: %s (the stopping runnable took 300ms)", handover.Round(10*time.Millisecond))
	// Release, then the standby's next retry: 300ms + at most 1.2 retry periods and some slack.
	if handover > 300*time.Millisecond+time.Duration(2.2*float64(s.RetryPeriod))+time.Second {
		t.Errorf("handover took %s, want within a retry period of the release", handover)
	}

	// The API server dies: the leader cannot renew, and must stop acting
	// (exit) within the renew deadline, since another replica could lead
	// once the Lease runs out.
	if err := cluster.KillAPIServer(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	select {
	case name := <-exits:
		if name != "second" {
			t.Errorf("replica %s exited, want the leader (second)", name)
		}
		if d := time.Since(killed); d > s.LeaseDuration {
			t.Errorf("the leader exited %s after its API server died, later than the lease duration %s", d, s.LeaseDuration)
		}
	case <-time.After(3 * s.LeaseDuration):
		t.Fatal("the leader did not exit after its API server died")
	}
}

func waitFor(timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return context.DeadlineExceeded
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}
