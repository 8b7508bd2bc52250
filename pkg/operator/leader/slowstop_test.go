package leader

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
)

// namedController stands for a controller-runtime controller: a struct
// with a Name.
type namedController struct{ Name string }

func (*namedController) Start(context.Context) error { return nil }

// embedsNamed has a Name only through a nil embedded pointer.
type embedsNamed struct{ *namedController }

// A runnable is named by its own Name field, else by its type, and naming
// never panics.
func TestRunnableNames(t *testing.T) {
	for _, tc := range []struct {
		r    *gated
		want string
	}{
		{&gated{Runnable: &namedController{Name: "nodeclaim.lifecycle"}}, "nodeclaim.lifecycle"},
		{&gated{Runnable: &namedController{}}, "*leader.namedController"},
		{&gated{Runnable: embedsNamed{}}, "leader.embedsNamed"},
	} {
		if got := tc.r.name(); got != tc.want {
			t.Errorf("name() = %q, want %q", got, tc.want)
		}
	}
}

// A leader-only runnable that does not return on a stop keeps the Lease
// held, and the replica says which runnable it waits for, then every
// goroutine's stack, so that a slow handover can be explained from the log.
func TestASlowStopNamesWhatItWaitsFor(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	logger := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{})
	g := &Gate{idle: make(chan struct{}), slowStop: 50 * time.Millisecond, log: logger}
	slow := &gated{Runnable: &namedController{Name: "nodeclaim.lifecycle"}, gate: g}
	quick := &gated{Runnable: &namedController{}, gate: g}
	if !g.enter(slow) || !g.enter(quick) {
		t.Fatal("runnables refused before the stop")
	}
	stopped := make(chan struct{})
	go func() { g.stopAndWait(); close(stopped) }()
	g.leave(quick)
	if err := waitFor(5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(lines) >= 2 }); err != nil {
		t.Fatalf("no report of the slow stop: %v", lines)
	}
	select {
	case <-stopped:
		t.Fatal("the stop returned (and the Lease would be released) while a runnable still runs")
	default:
	}
	mu.Lock()
	names, stacks := lines[0], lines[1]
	mu.Unlock()
	if !strings.Contains(names, `"running"=["nodeclaim.lifecycle"]`) {
		t.Errorf("the first report does not name the runnable still running (and only it): %s", names)
	}
	if !strings.Contains(stacks, "stopAndWait") || !strings.Contains(stacks, "goroutine ") {
		t.Errorf("the second report has no goroutine stacks: %.300s", stacks)
	}
	if g.enter(&gated{Runnable: &namedController{Name: "late"}, gate: g}) {
		t.Error("a runnable started after the stop began")
	}
	g.leave(slow)
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the stop did not return once the last runnable returned")
	}
}
