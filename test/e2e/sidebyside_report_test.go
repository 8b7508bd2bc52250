package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkSideBySide runs the side-by-side bench (see runBurst) and prints
// one table with each figure's ratio to kwok. Settings from the environment:
//
//	BENCH_N            burst sizes, comma-separated (default 100,500)
//	BENCH_CONTENDERS   kwok,machinedeployment,machine (default all three)
//	BENCH_DELAY        infrastructure delay = kwok's registration delay (default 5s)
//	BENCH_PROFILE_DIR  write 20 s CPU profiles of each contender's process there
//	BENCH_JSON         write the results there as JSON
//
// Run: go test -run '^$' -bench SideBySide -benchtime 1x -timeout 2h ./test/e2e/
func BenchmarkSideBySide(b *testing.B) {
	o := benchOptions{Delay: 5 * time.Second, ProfileDir: os.Getenv("BENCH_PROFILE_DIR")}
	if v := os.Getenv("BENCH_DELAY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("BENCH_DELAY: %v", err)
		}
		o.Delay = d
	}
	ns := []int{100, 500}
	if v := os.Getenv("BENCH_N"); v != "" {
		ns = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				b.Fatalf("BENCH_N: %q is no positive count", f)
			}
			ns = append(ns, n)
		}
	}
	names := []string{contenderKWOK, contenderMachineDeployment, contenderMachine}
	if v := os.Getenv("BENCH_CONTENDERS"); v != "" {
		names = strings.Split(v, ",")
	}
	results := sideBySide(b, ns, names, o)
	printSideBySide(os.Stdout, results)
	for _, r := range results {
		prefix := fmt.Sprintf("%s-%d-", r.Contender, r.N)
		b.ReportMetric(r.TotalS, prefix+"total-s")
		if k, ok := kwokOf(results, r.N); ok && r.Contender != contenderKWOK {
			b.ReportMetric(r.TotalS/k.TotalS, prefix+"total/kwok")
		}
	}
	if path := os.Getenv("BENCH_JSON"); path != "" {
		raw, err := json.MarshalIndent(results, "", "  ")
		if err == nil {
			err = os.WriteFile(path, raw, 0o644)
		}
		if err != nil {
			b.Fatalf("writing %s: %v", path, err)
		}
	}
}

// sideBySide runs every contender for every N, each in a fresh process,
// with the suite's provider stopped meanwhile (two Karpenters would both
// act on the pending pods), and checks the exact counts.
func sideBySide(tb testing.TB, ns []int, names []string, o benchOptions) []runResult {
	provider.Stop()
	defer func() {
		var err error
		if provider, err = StartProvider(bin, w, "provider.log"); err != nil {
			tb.Errorf("restarting the suite's provider: %v", err)
		}
	}()
	var results []runResult
	for _, n := range ns {
		for _, name := range names {
			c, ok := contenders[name]
			if !ok {
				tb.Fatalf("unknown contender %q", name)
			}
			o.N = n
			r := runBurst(tb, c, o)
			printRun(os.Stdout, r)
			results = append(results, r)
			want := map[string][2]int{"NodeClaims": {r.PeakNodeClaims, n}, "Nodes": {r.PeakNodes, n}}
			if name != contenderKWOK {
				want["Machines"] = [2]int{r.PeakMachines, n}
			}
			for what, got := range want {
				if got[0] != got[1] {
					tb.Errorf("%s, burst of %d: %d %s at the peak, want exactly %d", name, n, got[0], what, got[1])
				}
			}
		}
	}
	return results
}

func kwokOf(results []runResult, n int) (runResult, bool) {
	for _, r := range results {
		if r.Contender == contenderKWOK && r.N == n {
			return r, true
		}
	}
	return runResult{}, false
}

// printRun prints one run's figures and breakdown as it finishes.
func printRun(out io.Writer, r runResult) {
	fmt.Fprintf(out, "%s, %d pods (infrastructure delay %.0fs, load %s): all Running in %.1fs (pod start p50 %.1fs, p100 %.1fs), back to 0 in %.1fs; "+
		"process CPU %.1fs, peak RSS %.0f MiB, writes/node hub %.2f spoke %.2f; world CPU %.1fs; peak NodeClaims %d, Nodes %d, Machines %d\n",
		r.Contender, r.N, r.DelayS, r.LoadAvg, r.TotalS, r.PodStartP50S, r.PodStartP100S, r.ScaleDownS,
		r.CPUS, r.PeakRSSMiB, r.HubWritesPerNode, r.SpokeWritesPerNode, r.WorldCPUS, r.PeakNodeClaims, r.PeakNodes, r.PeakMachines)
	fmt.Fprintf(out, "  NodeClaims created in waves (count@time after the Deployment): %s\n", r.ClaimWaves)
	keys := make([]string, 0, len(r.Breakdown))
	for k := range r.Breakdown {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(out, "  %-50s p50 %6.2fs  p100 %6.2fs\n", k, r.Breakdown[k][0], r.Breakdown[k][1])
	}
}

// sideBySideFigures are the table's rows: label, value, whether a ratio to
// kwok means something.
var sideBySideFigures = []struct {
	label string
	value func(runResult) float64
	ratio bool
}{
	{"N pods created -> all Running (s)", func(r runResult) float64 { return r.TotalS }, true},
	{"pod start p50 (s)", func(r runResult) float64 { return r.PodStartP50S }, true},
	{"pod start p100 (s)", func(r runResult) float64 { return r.PodStartP100S }, true},
	{"scale-down to zero (s)", func(r runResult) float64 { return r.ScaleDownS }, true},
	{"process CPU (s)", func(r runResult) float64 { return r.CPUS }, true},
	{"process peak RSS (MiB)", func(r runResult) float64 { return r.PeakRSSMiB }, true},
	{"writes/node to the hub", func(r runResult) float64 { return r.HubWritesPerNode }, false},
	{"writes/node to the spoke", func(r runResult) float64 { return r.SpokeWritesPerNode }, true},
	{"world CPU: API servers, CAPI, sims (s)", func(r runResult) float64 { return r.WorldCPUS }, true},
}

// printSideBySide prints one table per N: a column per contender, with the
// ratio to kwok in parentheses.
func printSideBySide(out io.Writer, results []runResult) {
	byN := map[int][]runResult{}
	var ns []int
	for _, r := range results {
		if _, ok := byN[r.N]; !ok {
			ns = append(ns, r.N)
		}
		byN[r.N] = append(byN[r.N], r)
	}
	for _, n := range ns {
		rs := byN[n]
		k, hasKWOK := kwokOf(results, n)
		fmt.Fprintf(out, "\nside by side, N = %d (infrastructure delay %.0fs; load at start %s)\n", n, rs[0].DelayS, rs[0].LoadAvg)
		fmt.Fprintf(out, "%-40s", "figure")
		for _, r := range rs {
			fmt.Fprintf(out, " | %-20s", r.Contender)
		}
		fmt.Fprintln(out)
		fmt.Fprintln(out, strings.Repeat("-", 40+23*len(rs)))
		for _, f := range sideBySideFigures {
			fmt.Fprintf(out, "%-40s", f.label)
			for _, r := range rs {
				cell := fmt.Sprintf("%.4g", f.value(r))
				if hasKWOK && f.ratio && r.Contender != contenderKWOK {
					cell += fmt.Sprintf(" (%.2fx)", ratio(f.value(r), f.value(k)))
				}
				fmt.Fprintf(out, " | %-20s", cell)
			}
			fmt.Fprintln(out)
		}
	}
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return math.Inf(1)
	}
	return a / b
}
