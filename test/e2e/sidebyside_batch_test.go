package e2e

import (
	"slices"
	"testing"
)

func TestBenchBatchSetsCoreWindow(t *testing.T) {
	for _, tc := range []struct {
		in        string
		idle, max string
		bad       bool
	}{
		{in: "1s/10s", idle: "1s", max: "10s"},
		{in: "500ms/3s", idle: "500ms", max: "3s"},
		{in: "1s", bad: true},
		{in: "10s/1s", bad: true},
		{in: "0s/1s", bad: true},
		{in: "one/10s", bad: true},
	} {
		idle, max, err := parseBenchBatch(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("BENCH_BATCH=%q: accepted as %s/%s, want an error", tc.in, idle, max)
			}
			continue
		}
		if err != nil || idle != tc.idle || max != tc.max {
			t.Errorf("BENCH_BATCH=%q: got %q/%q, %v; want %s/%s", tc.in, idle, max, err, tc.idle, tc.max)
		}
	}

	// The window reaches the Karpenter contenders' environment after the
	// suite's own (a later entry wins in os/exec), and only when set.
	defer func(saved struct{ idle, max string }) { benchBatch = saved }(benchBatch)
	benchBatch.idle, benchBatch.max = "", ""
	if env := benchEnv(); slices.ContainsFunc(env, func(e string) bool { return len(e) > 6 && e[:6] == "BATCH_" }) {
		t.Errorf("no BENCH_BATCH: environment %v sets a batch window, want the suite's", env)
	}
	benchBatch.idle, benchBatch.max = "1s", "10s"
	env := benchEnv()
	for _, want := range []string{"BATCH_IDLE_DURATION=1s", "BATCH_MAX_DURATION=10s"} {
		if !slices.Contains(env, want) {
			t.Errorf("BENCH_BATCH=1s/10s: environment %v lacks %s", env, want)
		}
	}
}
