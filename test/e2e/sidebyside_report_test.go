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

// BenchmarkSideBySide runs the side-by-side bench (see runBurst and
// runFloor) and prints, per N, one table of the figures with each one's
// ratio to kwok, and one of each mode's ratios to kwok, to its Cluster API
// floor and to the larger of the two. Settings from the environment:
//
//	BENCH_N            burst sizes, comma-separated (default 100,500)
//	BENCH_CONTENDERS   kwok,capi-md,machinedeployment,capi-machines,machine
//	                   (default all five, in this order)
//	BENCH_DELAY        infrastructure delay = kwok's registration delay (default 5s)
//	BENCH_MDS          MachineDeployments of the same offering and price that the
//	                   machinedeployment contender and its capi-md floor use
//	                   (default 1; the floor scales each to its share of N)
//	BENCH_BATCH        core's batch window of the Karpenter contenders, "idle/max"
//	                   (default the suite's 500ms/3s; core's own defaults are 1s/10s)
//	BENCH_RUN_TIMEOUT  bound of each wait of a run (default 10 minutes, or 3 s
//	                   per node when longer): raise it on a loaded machine
//	BENCH_PROFILE_DIR  write 20 s CPU profiles of each contender's process there
//	BENCH_JSON         write the results there as JSON (appended to the runs
//	                   the file holds already: one file for several placements)
//	BENCH_PLACEMENT    the world: unset (in-process, as the other tests), shared
//	                   (its two sides in processes of their own, anywhere) or
//	                   separated (each side on CPUs of its own: BENCH_HUB_CPUS,
//	                   default the first CPU, BENCH_WORKLOAD_CPUS, default the
//	                   others; see suitePlacement)
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
	if v := os.Getenv("BENCH_RUN_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("BENCH_RUN_TIMEOUT: %q is no positive duration", v)
		}
		o.RunTimeout = d
	}
	if v := os.Getenv("BENCH_MDS"); v != "" {
		k, err := strconv.Atoi(v)
		if err != nil || k <= 0 {
			b.Fatalf("BENCH_MDS: %q is no positive count", v)
		}
		benchMDs = k
	}
	if v := os.Getenv("BENCH_BATCH"); v != "" {
		idle, max, err := parseBenchBatch(v)
		if err != nil {
			b.Fatal(err)
		}
		benchBatch.idle, benchBatch.max = idle, max
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
	names := allContenders
	if v := os.Getenv("BENCH_CONTENDERS"); v != "" {
		names = strings.Split(v, ",")
	}
	results := sideBySide(b, ns, names, o)
	printSideBySide(os.Stdout, results)
	// The figures hack/bench.sh holds against targets.
	for _, r := range results {
		prefix := fmt.Sprintf("%s-%s-%d-", r.Placement, r.Contender, r.N)
		b.ReportMetric(r.TotalS, prefix+"total-s")
		b.ReportMetric(r.HubCPUS+r.WorkloadCPUS, prefix+"sides-cpu-s")
		b.ReportMetric(r.HubAPIWritesPerNode, prefix+"hub-api-writes/node")
		if r.FloorOf != "" || r.Contender == contenderKWOK {
			continue
		}
		b.ReportMetric(r.HubWritesPerNode, prefix+"hub-writes/node")
		for metric, key := range map[string]string{"total": "total_s", "cpu": "cpu_s"} {
			rs := r.Ratios[key]
			for name, v := range map[string]*float64{"kwok": rs.ToKWOK, "floor": rs.ToFloor, "max": rs.ToMax} {
				if v != nil {
					b.ReportMetric(*v, prefix+metric+"/"+name)
				}
			}
		}
		for metric, key := range map[string]string{"sides-cpu": "sides_cpu_per_node_s", "hub-api-writes": "hub_api_writes_per_node", "spoke-api-writes": "spoke_api_writes_per_node"} {
			if v := r.Ratios[key].ToSum; v != nil {
				b.ReportMetric(*v, prefix+metric+"/sum")
			}
		}
	}
	if path := os.Getenv("BENCH_JSON"); path != "" {
		if err := appendResults(path, results); err != nil {
			b.Fatalf("writing %s: %v", path, err)
		}
	}
}

// appendResults writes the runs to path after those it holds already.
func appendResults(path string, results []runResult) error {
	var all []json.RawMessage
	if raw, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(raw))) > 0 {
		if err := json.Unmarshal(raw, &all); err != nil {
			return fmt.Errorf("%s holds no JSON array of runs: %w", path, err)
		}
	} else if err != nil && !os.IsNotExist(err) {
		return err
	}
	for _, r := range results {
		raw, err := json.Marshal(r)
		if err != nil {
			return err
		}
		all = append(all, raw)
	}
	raw, err := json.MarshalIndent(all, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, raw, 0o644)
}

// parseBenchBatch reads BENCH_BATCH: core's batch window as "idle/max",
// two positive durations with idle no longer than max.
func parseBenchBatch(v string) (idle, max string, err error) {
	i, m, ok := strings.Cut(v, "/")
	di, errIdle := time.ParseDuration(i)
	dm, errMax := time.ParseDuration(m)
	if !ok || errIdle != nil || errMax != nil || di <= 0 || dm < di {
		return "", "", fmt.Errorf("BENCH_BATCH: %q is not idle/max with 0 < idle <= max, e.g. 1s/10s", v)
	}
	return i, m, nil
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
			o.N = n
			var r runResult
			began := time.Now()
			if c, ok := contenders[name]; ok {
				r = runBurst(tb, c, o)
			} else if f, ok := floors[name]; ok {
				r = runFloor(tb, f, o)
			} else {
				tb.Fatalf("unknown contender %q (BENCH_CONTENDERS: %s)", name, strings.Join(allContenders, ","))
			}
			r.WallS = time.Since(began).Seconds()
			printRun(os.Stdout, r)
			results = append(results, r)
			errs, warnings := peakProblems(r, n)
			for _, e := range errs {
				tb.Error(e)
			}
			for _, w := range warnings {
				tb.Log("WARNING: " + w)
			}
		}
	}
	for i, r := range results {
		results[i].Ratios = modeRatios(results, r)
		// A floor gives Cluster API at once what the mode asks over the
		// burst: a floor slower than its mode measures something else.
		fl, ok := resultOf(results, floorOf(r.Contender), r.N)
		if !ok {
			continue
		}
		if r.NodesReadyS > 0 && fl.NodesReadyS > r.NodesReadyS {
			tb.Logf("WARNING: %s at N = %d: its floor %s took %.1fs to N Nodes Ready, the mode %.1fs: look at the floor", r.Contender, r.N, fl.Contender, fl.NodesReadyS, r.NodesReadyS)
		}
		if zoneNames(fl.MachineZones) != zoneNames(r.MachineZones) {
			tb.Logf("WARNING: %s at N = %d: Machines by zone %s, its floor %s's %s: the floor does not launch what the mode does", r.Contender, r.N, r.MachineZones, fl.Contender, fl.MachineZones)
		}
	}
	return results
}

// peakProblems holds a run's peak counts against its N: a Karpenter
// contender must reach exactly N NodeClaims, Nodes and Machines (kwok has
// no Machines), never more; a Cluster API floor (no NodeClaims) must reach
// N Nodes and Machines, and more than N is Cluster API's own doing, a
// warning, not the provider's.
func peakProblems(r runResult, n int) (errs, warnings []string) {
	want := map[string]int{"Nodes": r.PeakNodes}
	if r.FloorOf == "" {
		want["NodeClaims"] = r.PeakNodeClaims
	}
	if r.Contender != contenderKWOK {
		want["Machines"] = r.PeakMachines
	}
	for _, what := range []string{"NodeClaims", "Nodes", "Machines"} {
		got, ok := want[what]
		switch {
		case !ok || got == n:
		case r.FloorOf != "" && got > n:
			warnings = append(warnings, fmt.Sprintf("%s, burst of %d: %d %s at the peak: Cluster API alone made more than the %d it was asked for", r.Contender, n, got, what, n))
		default:
			errs = append(errs, fmt.Sprintf("%s, burst of %d: %d %s at the peak, want exactly %d", r.Contender, n, got, what, n))
		}
	}
	return errs, warnings
}

// zoneNames keeps the zones of "zone=count ..." (timeline.zoneCounts):
// a mode makes more Machines than its floor when NodeClaims time out, in
// the same zones.
func zoneNames(counts string) string {
	fields := strings.Fields(counts)
	for i, f := range fields {
		fields[i], _, _ = strings.Cut(f, "=")
	}
	return strings.Join(fields, " ")
}

func kwokOf(results []runResult, n int) (runResult, bool) {
	return resultOf(results, contenderKWOK, n)
}

func resultOf(results []runResult, contender string, n int) (runResult, bool) {
	for _, r := range results {
		if r.Contender == contender && r.N == n {
			return r, true
		}
	}
	return runResult{}, false
}

// figureRatios are one figure of a mode against its references: kwok (the
// floor of Karpenter's own work), the mode's Cluster API floor (that of
// the infrastructure), and the larger of the two, which is what a provider
// that overlapped Karpenter's decisions with Cluster API's work entirely
// would reach. Absent: the reference was not run or has no such figure.
//
// For the world's work (CPU, API requests), whose parts add up, the mode is
// also held against the sum of kwok's and its floor's: what Karpenter's own
// work plus Cluster API's own work cost; beyond it is what the provider
// makes the world do.
type figureRatios struct {
	ToKWOK  *float64 `json:"to_kwok,omitempty"`
	ToFloor *float64 `json:"to_floor,omitempty"`
	Max     *float64 `json:"max_kwok_floor,omitempty"`
	ToMax   *float64 `json:"to_max,omitempty"`
	Sum     *float64 `json:"kwok_plus_floor,omitempty"`
	ToSum   *float64 `json:"to_kwok_plus_floor,omitempty"`
}

// modeRatios are a mode's figureRatios by figure key (nil for kwok and the
// floors).
func modeRatios(results []runResult, r runResult) map[string]figureRatios {
	if r.FloorOf != "" || r.Contender == contenderKWOK {
		return nil
	}
	k, hasKWOK := kwokOf(results, r.N)
	fl, hasFloor := resultOf(results, floorOf(r.Contender), r.N)
	out := map[string]figureRatios{}
	for _, f := range sideBySideFigures {
		v := f.value(r)
		var fr figureRatios
		var refs []float64
		if hasKWOK && f.ratio {
			fr.ToKWOK = finite(ratio(v, f.value(k)))
			refs = append(refs, f.value(k))
		}
		if hasFloor && f.floor {
			fr.ToFloor = finite(ratio(v, f.value(fl)))
			refs = append(refs, f.value(fl))
		}
		if len(refs) == 2 {
			m := max(refs[0], refs[1])
			fr.Max, fr.ToMax = &m, finite(ratio(v, m))
		}
		if f.sum && hasKWOK && hasFloor {
			sum := f.value(k) + f.value(fl)
			fr.Sum, fr.ToSum = &sum, finite(ratio(v, sum))
		}
		if fr != (figureRatios{}) {
			out[f.key] = fr
		}
	}
	return out
}

// finite is v, or nil when it is no number JSON can hold.
func finite(v float64) *float64 {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return nil
	}
	return &v
}

// printRun prints one run's figures and breakdown as it finishes.
func printRun(out io.Writer, r runResult) {
	over := ""
	if r.MachineDeployments > 1 {
		over = fmt.Sprintf(" over %d MachineDeployments", r.MachineDeployments)
	}
	if r.FloorOf != "" {
		fmt.Fprintf(out, "%s (Cluster API floor of %s, no Karpenter)%s, %d nodes (infrastructure delay %.0fs, load %s): all Nodes Ready in %.1fs (p50 %.1fs), "+
			"%d Machines with a providerID in %.1fs; back to 0 Nodes in %.1fs, 0 Machines in %.1fs; world CPU %.1fs; peak Nodes %d, Machines %d; Machines by zone %s; the run took %.0fs\n",
			r.Contender, r.FloorOf, over, r.N, r.DelayS, r.LoadAvg, r.TotalS, r.PodStartP50S, r.N, r.MachinesRunningS, r.NodesGoneS, r.ScaleDownS,
			r.WorldCPUS, r.PeakNodes, r.PeakMachines, r.MachineZones, r.WallS)
		printCost(out, r)
		printBreakdown(out, r)
		return
	}
	fmt.Fprintf(out, "%s%s, %d pods (infrastructure delay %.0fs, load %s): all Running in %.1fs (pod start p50 %.1fs, p100 %.1fs), back to 0 in %.1fs; "+
		"process CPU %.1fs, peak RSS %.0f MiB, writes/node hub %.2f spoke %.2f; world CPU %.1fs; peak NodeClaims %d, Nodes %d, Machines %d, Machines beyond NodeClaims %d; the run took %.0fs\n",
		r.Contender, over, r.N, r.DelayS, r.LoadAvg, r.TotalS, r.PodStartP50S, r.PodStartP100S, r.ScaleDownS,
		r.CPUS, r.PeakRSSMiB, r.HubWritesPerNode, r.SpokeWritesPerNode, r.WorldCPUS, r.PeakNodeClaims, r.PeakNodes, r.PeakMachines, r.PeakMachineSurplus, r.WallS)
	if r.Batch != "" {
		fmt.Fprintf(out, "  core's batch window (idle/max): %s\n", r.Batch)
	}
	fmt.Fprintf(out, "  NodeClaims created in waves (count@time after the Deployment): %s\n", r.ClaimWaves)
	if r.MachineZones != "" {
		fmt.Fprintf(out, "  Machines by zone: %s\n", r.MachineZones)
	}
	printCost(out, r)
	printBreakdown(out, r)
}

// printCost prints a run's cost per node as it finishes (the tables at the
// end hold the same): a bench cut short keeps it.
func printCost(out io.Writer, r runResult) {
	n := float64(r.N)
	fmt.Fprintf(out, "  cost per node: CPU management side %.3fs, workload side %.3fs, Karpenter process %.3fs, bench process %.3fs; "+
		"hub API requests %.1f (writes %.1f), spoke API requests %.1f (writes %.1f)\n",
		r.HubCPUS/n, r.WorkloadCPUS/n, r.CPUS/n, r.HarnessCPUS/n, r.HubRequestsPerNode, r.HubAPIWritesPerNode, r.SpokeRequestsPerNode, r.SpokeAPIWritesPerNode)
}

func printBreakdown(out io.Writer, r runResult) {
	keys := make([]string, 0, len(r.Breakdown))
	for k := range r.Breakdown {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(out, "  %-50s p50 %6.2fs  p100 %6.2fs\n", k, r.Breakdown[k][0], r.Breakdown[k][1])
	}
}

// sideBySideFigures are the table's rows: JSON key, label, value, whether
// a ratio to kwok means something, whether a Cluster API floor has the
// figure (it has no process, no pods: its times run to Nodes Ready), and
// whether it adds up over kwok and the floor (the world's work).
var sideBySideFigures = []struct {
	key   string
	label string
	value func(runResult) float64
	ratio bool
	floor bool
	sum   bool
}{
	{"total_s", "N pods created -> all Running (s)", func(r runResult) float64 { return r.TotalS }, true, true, false},
	{"pod_start_p50_s", "pod start p50 (s)", func(r runResult) float64 { return r.PodStartP50S }, true, true, false},
	{"pod_start_p100_s", "pod start p100 (s)", func(r runResult) float64 { return r.PodStartP100S }, true, true, false},
	{"nodes_ready_s", "start -> N Nodes Ready (s)", func(r runResult) float64 { return r.NodesReadyS }, true, true, false},
	{"machines_running_s", "start -> N Machines with providerID (s)", func(r runResult) float64 { return r.MachinesRunningS }, false, true, false},
	{"scale_down_s", "scale-down to zero (s)", func(r runResult) float64 { return r.ScaleDownS }, true, true, false},
	{"nodes_gone_s", "scale-down to 0 Nodes (s)", func(r runResult) float64 { return r.NodesGoneS }, true, true, false},
	{"cpu_s", "process CPU (s)", func(r runResult) float64 { return r.CPUS }, true, false, false},
	{"peak_rss_mib", "process peak RSS (MiB)", func(r runResult) float64 { return r.PeakRSSMiB }, true, false, false},
	{"hub_writes_per_node", "writes/node to the hub", func(r runResult) float64 { return r.HubWritesPerNode }, false, false, false},
	{"spoke_writes_per_node", "writes/node to the spoke", func(r runResult) float64 { return r.SpokeWritesPerNode }, true, false, false},
	{"world_cpu_s", "world CPU: API servers, CAPI, sims (s)", func(r runResult) float64 { return r.WorldCPUS }, true, true, true},
	{"total_cpu_s", "CPU, process + world (s)", func(r runResult) float64 { return r.CPUS + r.WorldCPUS }, true, true, false},
	// Per node and per side: what holds on any machine.
	{"hub_cpu_per_node_s", "CPU/node, management side (s)", func(r runResult) float64 { return r.HubCPUS / float64(r.N) }, false, true, true},
	{"workload_cpu_per_node_s", "CPU/node, workload side (s)", func(r runResult) float64 { return r.WorkloadCPUS / float64(r.N) }, true, true, true},
	{"sides_cpu_per_node_s", "CPU/node, both sides (s)", func(r runResult) float64 { return (r.HubCPUS + r.WorkloadCPUS) / float64(r.N) }, true, true, true},
	{"provider_cpu_per_node_s", "CPU/node, Karpenter process (s)", func(r runResult) float64 { return r.CPUS / float64(r.N) }, true, false, false},
	{"harness_cpu_per_node_s", "CPU/node, bench process (s)", func(r runResult) float64 { return r.HarnessCPUS / float64(r.N) }, false, true, false},
	{"hub_requests_per_node", "hub API requests/node (all clients)", func(r runResult) float64 { return r.HubRequestsPerNode }, false, true, true},
	{"hub_api_writes_per_node", "hub API writes/node (all clients)", func(r runResult) float64 { return r.HubAPIWritesPerNode }, false, true, true},
	{"spoke_requests_per_node", "spoke API requests/node (all clients)", func(r runResult) float64 { return r.SpokeRequestsPerNode }, true, true, true},
	{"spoke_api_writes_per_node", "spoke API writes/node (all clients)", func(r runResult) float64 { return r.SpokeAPIWritesPerNode }, true, true, true},
}

// printSideBySide prints per N a table with a column per contender (the
// ratio to kwok in parentheses; "-": the contender has no such figure),
// then each mode's ratios to kwok, to its floor and to the larger of the
// two. Each block ends with an empty line.
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
		fmt.Fprintf(out, "\nside by side, N = %d, placement %s (infrastructure delay %.0fs; load at start %s; capi-*: Cluster API floors, no Karpenter, times to Nodes Ready)\n", n, placementLabel(rs[0]), rs[0].DelayS, rs[0].LoadAvg)
		fmt.Fprintf(out, "%-40s", "figure")
		for _, r := range rs {
			fmt.Fprintf(out, " | %-20s", r.Contender)
		}
		fmt.Fprintln(out)
		fmt.Fprintln(out, strings.Repeat("-", 40+23*len(rs)))
		for _, f := range sideBySideFigures {
			fmt.Fprintf(out, "%-40s", f.label)
			for _, r := range rs {
				cell := "-"
				if (r.FloorOf == "" || f.floor) && !(f.key == "machines_running_s" && r.MachinesRunningS == 0) {
					cell = fmt.Sprintf("%.4g", f.value(r))
					if hasKWOK && f.ratio && r.Contender != contenderKWOK {
						cell += fmt.Sprintf(" (%.2fx)", ratio(f.value(r), f.value(k)))
					}
				}
				fmt.Fprintf(out, " | %-20s", cell)
			}
			fmt.Fprintln(out)
		}
		fmt.Fprintln(out)
		printRatios(out, n, rs)
		printRequestBreakdown(out, rs)
	}
}

// placementLabel names a run's placement with its CPU sets.
func placementLabel(r runResult) string {
	if r.HubCPUSet != "" {
		return fmt.Sprintf("%s (management side on CPUs %s, workload side and Karpenter on %s)", r.Placement, r.HubCPUSet, r.WorkloadCPUSet)
	}
	return r.Placement
}

// printRatios prints the ratios block of one N (nothing without a mode).
func printRatios(out io.Writer, n int, rs []runResult) {
	var modes []runResult
	for _, r := range rs {
		if len(r.Ratios) > 0 {
			modes = append(modes, r)
		}
	}
	if len(modes) == 0 {
		return
	}
	fmt.Fprintf(out, "ratios, N = %d: each mode to kwok, to its Cluster API floor (machinedeployment: capi-md, machine: capi-machines), "+
		"to max(kwok, floor), what a provider overlapping Karpenter's decisions with Cluster API's work entirely would reach, "+
		"and for the world's work to kwok's plus the floor's\n", n)
	fmt.Fprintf(out, "%-40s | %-17s | %8s | %8s | %15s | %8s | %10s | %8s\n", "figure", "mode", "/kwok", "/floor", "max(kwok,floor)", "/max", "kwok+floor", "/sum")
	fmt.Fprintln(out, strings.Repeat("-", 40+3+17+3+8+3+8+3+15+3+8+3+10+3+8))
	show := func(v *float64, format string) string {
		if v == nil {
			return "-"
		}
		return fmt.Sprintf(format, *v)
	}
	for _, f := range sideBySideFigures {
		label := f.label
		for _, m := range modes {
			fr, ok := m.Ratios[f.key]
			if !ok {
				continue
			}
			fmt.Fprintf(out, "%-40s | %-17s | %8s | %8s | %15s | %8s | %10s | %8s\n", label, m.Contender,
				show(fr.ToKWOK, "%.2fx"), show(fr.ToFloor, "%.2fx"), show(fr.Max, "%.4g"), show(fr.ToMax, "%.2fx"), show(fr.Sum, "%.4g"), show(fr.ToSum, "%.2fx"))
			label = ""
		}
	}
	fmt.Fprintln(out)
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return math.Inf(1)
	}
	return a / b
}
