package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/autonode/karpenter-clusterapi/test/placement"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// What a contender costs, measured so that it holds on any machine: the
// CPU seconds of each side of the world and of the contender's process,
// and the requests each API server served, by verb and resource, from its
// own apiserver_request_total. Both are read before and after a run; the
// run's cost is the difference.

// costSnapshot is the counters at one moment.
type costSnapshot struct {
	// cpu by side: world.SideHub, world.SideWorkload, sideProvider,
	// sideHarness (this test process).
	cpu map[string]float64
	// requests by API server ("hub", "spoke"), then by "VERB resource".
	requests map[string]map[string]float64
}

const (
	sideProvider = "provider"
	// sideHarness is this test process: the bench's watches and the floors'
	// writes, and in an in-process world Cluster API's controllers and the
	// simulators too.
	sideHarness = "harness"
)

// runCost is a run's cost: CPU seconds by side, requests by API server and
// "VERB resource[/subresource]".
type runCost struct {
	CPUS     map[string]float64            `json:"cpu_s"`
	Requests map[string]map[string]float64 `json:"requests"`
}

// takeCost reads the counters; providerPid 0: no contender process.
func takeCost(ctx context.Context, providerPid int) (costSnapshot, error) {
	s := costSnapshot{cpu: map[string]float64{}, requests: map[string]map[string]float64{}}
	procs, err := w.Processes()
	if err != nil {
		return s, err
	}
	for _, p := range procs {
		cpu, _, err := procCPU(p.Pid)
		if err != nil {
			return s, fmt.Errorf("CPU of %s (pid %d): %w", p.Name, p.Pid, err)
		}
		s.cpu[p.Side] += cpu
	}
	if providerPid > 0 {
		if s.cpu[sideProvider], _, err = procCPU(providerPid); err != nil {
			return s, fmt.Errorf("CPU of the contender's process: %w", err)
		}
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return s, err
	}
	s.cpu[sideHarness] = tv(ru.Utime) + tv(ru.Stime)
	for name, cfg := range map[string]*rest.Config{"hub": w.Hub.Config, "spoke": w.Spoke.Config} {
		if s.requests[name], err = apiServerRequests(ctx, cfg); err != nil {
			return s, fmt.Errorf("%s API server's metrics: %w", name, err)
		}
	}
	return s, nil
}

// since is the cost from an earlier snapshot to this one.
func (s costSnapshot) since(before costSnapshot) runCost {
	c := runCost{CPUS: map[string]float64{}, Requests: map[string]map[string]float64{}}
	for side, v := range s.cpu {
		c.CPUS[side] = v - before.cpu[side]
	}
	for server, by := range s.requests {
		c.Requests[server] = map[string]float64{}
		for k, v := range by {
			if d := v - before.requests[server][k]; d > 0 {
				c.Requests[server][k] = d
			}
		}
	}
	return c
}

// apiServerRequests reads an API server's apiserver_request_total by
// "VERB resource[/subresource]" (codes, groups, versions and scopes summed).
func apiServerRequests(ctx context.Context, cfg *rest.Config) (map[string]float64, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	return parseRequestTotals(string(raw))
}

// parseRequestTotals sums apiserver_request_total by verb, resource and
// subresource from the Prometheus text format.
func parseRequestTotals(text string) (map[string]float64, error) {
	out := map[string]float64{}
	const name = "apiserver_request_total{"
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			return nil, fmt.Errorf("malformed series %q", line)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("series %q: %w", line, err)
		}
		l := parseLabels(labels)
		key := l["verb"] + " " + l["resource"]
		if l["resource"] == "" {
			key = l["verb"] + " (non-resource)"
		}
		if l["subresource"] != "" {
			key += "/" + l["subresource"]
		}
		out[key] += v
	}
	return out, nil
}

// writeVerbs are the verbs that change state (apiserver_request_total names
// them as HTTP does: POST, PUT, PATCH, DELETE; and DELETECOLLECTION, APPLY).
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "CREATE": true, "UPDATE": true, "PATCH": true, "DELETE": true, "DELETECOLLECTION": true, "APPLY": true}

// requestTotals are an API server's requests of a run (WATCH aside: a
// watch is one request however much it carries) and its writes.
func (c runCost) requestTotals(server string) (requests, writes float64) {
	for k, v := range c.Requests[server] {
		verb, _, _ := strings.Cut(k, " ")
		if verb == "WATCH" || verb == "WATCHLIST" {
			continue
		}
		requests += v
		if writeVerbs[verb] {
			writes += v
		}
	}
	return requests, writes
}

// printRequestBreakdown prints, per API server, each contender's requests
// per node by verb and resource (reads and writes; rows under 0.05 per
// node for every contender are left out).
func printRequestBreakdown(out io.Writer, rs []runResult) {
	for _, server := range []string{"hub", "spoke"} {
		keys := map[string]bool{}
		for _, r := range rs {
			for k, v := range r.Cost.Requests[server] {
				if !strings.HasPrefix(k, "WATCH") && v/float64(r.N) >= 0.05 {
					keys[k] = true
				}
			}
		}
		if len(keys) == 0 {
			continue
		}
		sorted := make([]string, 0, len(keys))
		for k := range keys {
			sorted = append(sorted, k)
		}
		sort.Slice(sorted, func(i, j int) bool {
			wi, wj := writeVerbs[strings.Fields(sorted[i])[0]], writeVerbs[strings.Fields(sorted[j])[0]]
			if wi != wj {
				return wi
			}
			return sorted[i] < sorted[j]
		})
		fmt.Fprintf(out, "%s API server: requests per node by verb and resource (its apiserver_request_total; writes first)\n", server)
		fmt.Fprintf(out, "%-40s", "verb resource")
		for _, r := range rs {
			fmt.Fprintf(out, " | %-17s", r.Contender)
		}
		fmt.Fprintln(out)
		fmt.Fprintln(out, strings.Repeat("-", 40+20*len(rs)))
		for _, k := range sorted {
			fmt.Fprintf(out, "%-40s", k)
			for _, r := range rs {
				fmt.Fprintf(out, " | %-17s", fmt.Sprintf("%.2f", r.Cost.Requests[server][k]/float64(r.N)))
			}
			fmt.Fprintln(out)
		}
		fmt.Fprintln(out)
	}
}

// setCost records a run's cost and its per-node figures.
func (r *runResult) setCost(c runCost) {
	r.Cost = c
	r.HubCPUS, r.WorkloadCPUS, r.HarnessCPUS = c.CPUS[world.SideHub], c.CPUS[world.SideWorkload], c.CPUS[sideHarness]
	n := float64(r.N)
	req, wr := c.requestTotals("hub")
	r.HubRequestsPerNode, r.HubAPIWritesPerNode = req/n, wr/n
	req, wr = c.requestTotals("spoke")
	r.SpokeRequestsPerNode, r.SpokeAPIWritesPerNode = req/n, wr/n
}

// Placements of the side-by-side bench's world (BENCH_PLACEMENT).
const (
	placementInProcess = "in-process" // unset: the suite's world
	placementShared    = "shared"     // split world, every process anywhere
	placementSeparated = "separated"  // split world, each side on its CPUs
)

// benchPlacement is the suite world's placement; benchSplit its split
// options (nil in process).
var (
	benchPlacement = placementInProcess
	benchSplit     *world.SplitOptions
)

// parsePlacement reads BENCH_PLACEMENT (and, when separated,
// BENCH_HUB_CPUS and BENCH_WORKLOAD_CPUS; by default the first CPU this
// process may use for the hub side, the others for the workload side).
func parsePlacement(name, hubCPUs, workloadCPUs string, online placement.CPUs) (*world.SplitOptions, error) {
	switch name {
	case "", placementInProcess:
		return nil, nil
	case placementShared:
		return &world.SplitOptions{}, nil
	case placementSeparated:
	default:
		return nil, fmt.Errorf("BENCH_PLACEMENT: %q is none of %s, %s, %s", name, placementInProcess, placementShared, placementSeparated)
	}
	if len(online) < 2 && (hubCPUs == "" || workloadCPUs == "") {
		return nil, fmt.Errorf("BENCH_PLACEMENT=%s needs 2 CPUs, this process may use %s", placementSeparated, online)
	}
	o := &world.SplitOptions{HubCPUs: online[:1], WorkloadCPUs: online[1:]}
	for env, set := range map[string]*placement.CPUs{"BENCH_HUB_CPUS=" + hubCPUs: &o.HubCPUs, "BENCH_WORKLOAD_CPUS=" + workloadCPUs: &o.WorkloadCPUs} {
		_, v, _ := strings.Cut(env, "=")
		if v == "" {
			continue
		}
		cpus, err := placement.Parse(v)
		if err != nil || len(cpus) == 0 {
			return nil, fmt.Errorf("%s: no CPU list (%v)", env, err)
		}
		*set = cpus
	}
	for _, c := range o.HubCPUs {
		if slices.Contains(o.WorkloadCPUs, c) {
			return nil, fmt.Errorf("BENCH_HUB_CPUS %s and BENCH_WORKLOAD_CPUS %s share CPU %d: the sides must not", o.HubCPUs, o.WorkloadCPUs, c)
		}
	}
	return o, nil
}

// suitePlacement sets the suite's world options from BENCH_PLACEMENT and,
// when separated, pins this process (the harness) to the workload side,
// where the Karpenter processes it starts run too.
func suitePlacement() (world.Options, error) {
	online, err := placement.Online()
	if err != nil {
		return world.Options{}, err
	}
	name := os.Getenv("BENCH_PLACEMENT")
	split, err := parsePlacement(name, os.Getenv("BENCH_HUB_CPUS"), os.Getenv("BENCH_WORKLOAD_CPUS"), online)
	if err != nil || split == nil {
		return world.Options{}, err
	}
	benchPlacement, benchSplit = name, split
	if len(split.WorkloadCPUs) > 0 {
		if err := placement.PinProcess(os.Getpid(), split.WorkloadCPUs); err != nil {
			return world.Options{}, err
		}
		karpenterCPUs = split.WorkloadCPUs
	}
	return world.Options{Split: split}, nil
}
