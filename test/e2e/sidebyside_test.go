package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// The side-by-side bench runs the same burst, in the same world, through
// its contenders one after the other, each in a fresh process: Karpenter
// with its own kwok provider (no infrastructure: Nodes appear after a
// registration delay), and this provider in MachineDeployment mode and in
// Machine mode (Cluster API's real controllers, the simulated EC2 whose
// instances run after a provisioning delay equal to kwok's registration
// delay). Same spoke, same kube-scheduler, same pods (N pause pods of
// 1500m, one per m5.large node), same NodePool shape and core settings.
//
// Each mode has a Cluster API floor too (sidebyside_floor_test.go): no
// Karpenter at all, the same fixtures given at once what the mode asks of
// Cluster API over the burst (capi-md: the MachineDeployment scaled from 0
// to N in one write; capi-machines: N Machines created as Machine mode
// creates them). kwok is the floor of Karpenter's own decisions, the
// Cluster API floor that of the infrastructure below the provider.

const (
	contenderKWOK              = "kwok"
	contenderMachineDeployment = "machinedeployment"
	contenderMachine           = "machine"
	contenderFloorMD           = "capi-md"
	contenderFloorMachines     = "capi-machines"
	benchPrice                 = 0.096 // m5.large on demand, $/h
)

// allContenders is the default order: each floor right before its mode.
var allContenders = []string{contenderKWOK, contenderFloorMD, contenderMachineDeployment, contenderFloorMachines, contenderMachine}

// runResult is one contender's burst of N pods and back to zero. A floor
// (FloorOf set) has no pods and no process: its times run from its write
// to Nodes Ready, "pod start" is each Node's time from the write to Ready,
// and its process figures are 0.
type runResult struct {
	Contender string `json:"contender"`
	// MachineDeployments the machinedeployment contender or its floor used
	// (BENCH_MDS; 0 for the others).
	MachineDeployments int `json:"machine_deployments,omitempty"`
	// Batch is core's batch window the Karpenter contenders ran with
	// (BENCH_BATCH, "idle/max"; empty: the suite's 500ms/3s).
	Batch string `json:"batch,omitempty"`
	// FloorOf is the mode a Cluster API floor is the floor of.
	FloorOf string  `json:"floor_of,omitempty"`
	N       int     `json:"n"`
	DelayS  float64 `json:"infra_delay_s"`
	// Pods: created -> Running, per pod (p50, p100), and from the
	// Deployment's creation to the last pod Running (total).
	PodStartP50S  float64 `json:"pod_start_p50_s"`
	PodStartP100S float64 `json:"pod_start_p100_s"`
	TotalS        float64 `json:"total_s"`
	// From the start (the Deployment, or the floor's write) to N Nodes
	// Ready, and to N Machines with a providerID (0: no Machines).
	NodesReadyS      float64 `json:"nodes_ready_s"`
	MachinesRunningS float64 `json:"machines_running_s,omitempty"`
	// Scale-down: Deployment to 0 -> no NodeClaim, Node or Machine left;
	// and to no Node left.
	ScaleDownS float64 `json:"scale_down_s"`
	NodesGoneS float64 `json:"nodes_gone_s"`
	// The contender's process over the whole run (up and down).
	CPUS               float64 `json:"cpu_s"`
	PeakRSSMiB         float64 `json:"peak_rss_mib"`
	HubWritesPerNode   float64 `json:"hub_writes_per_node"`
	SpokeWritesPerNode float64 `json:"spoke_writes_per_node"`
	// CPU of everything else (API servers, etcd, scheduler, Cluster API,
	// simulated AWS and kubelet, the bench's own watches) over the run.
	WorldCPUS float64 `json:"world_cpu_s"`
	// Placement of the world (BENCH_PLACEMENT) and, when separated, the CPU
	// sets of its sides.
	Placement      string `json:"placement"`
	HubCPUSet      string `json:"hub_cpus,omitempty"`
	WorkloadCPUSet string `json:"workload_cpus,omitempty"`
	// CPU over the run of the management side (hub API server, etcd, and
	// in a split world Cluster API and the simulated AWS), of the workload
	// side (spoke API server, etcd, scheduler, controller manager, and in a
	// split world the simulated kubelet) and of this test process (the
	// bench's watches and a floor's writes; in process also Cluster API and
	// the simulators).
	HubCPUS      float64 `json:"hub_cpu_s"`
	WorkloadCPUS float64 `json:"workload_cpu_s"`
	HarnessCPUS  float64 `json:"harness_cpu_s"`
	// Requests per node each API server served (WATCH aside), and its
	// writes, from its own apiserver_request_total: every client's.
	HubRequestsPerNode    float64 `json:"hub_requests_per_node"`
	HubAPIWritesPerNode   float64 `json:"hub_api_writes_per_node"`
	SpokeRequestsPerNode  float64 `json:"spoke_requests_per_node"`
	SpokeAPIWritesPerNode float64 `json:"spoke_api_writes_per_node"`
	// Cost holds the same by side and by verb and resource.
	Cost runCost `json:"cost"`
	// Most objects seen at once: must be exactly N.
	PeakNodeClaims int `json:"peak_nodeclaims"`
	PeakNodes      int `json:"peak_nodes"`
	PeakMachines   int `json:"peak_machines"`
	// Most Machines beyond NodeClaims (neither deleting) at once during the
	// scale-up: Machines made for NodeClaims core gave up on, not yet
	// given back (docs/performance.md states the bound).
	PeakMachineSurplus int `json:"peak_machine_surplus"`
	// Where the time goes (seconds, p50/p100 over objects).
	Breakdown map[string][2]float64 `json:"breakdown"`
	// NodeClaims created by core's successive scheduling rounds: count@start.
	ClaimWaves string `json:"claim_waves"`
	// MachineZones are the Machines per failure domain: "zone=count ...".
	MachineZones string `json:"machine_zones,omitempty"`
	LoadAvg      string `json:"load_avg"`
	// WallS is what the run cost in wall time: setup, burst, scale-down.
	WallS    float64  `json:"wall_s"`
	Profiles []string `json:"profiles,omitempty"`
	// Ratios of a mode's figures (by figure key) to kwok's, to its floor's
	// and to the larger of the two (see modeRatios).
	Ratios map[string]figureRatios `json:"ratios,omitempty"`
}

// contender sets up its pool and starts its process.
type contender struct {
	name  string
	setup func(tb testing.TB, ctx context.Context, pool string, delay time.Duration) (*Provider, func(), error)
}

var contenders = map[string]contender{
	contenderKWOK: {contenderKWOK, func(tb testing.TB, ctx context.Context, pool string, delay time.Duration) (*Provider, func(), error) {
		if err := installKWOKCRD(); err != nil {
			return nil, nil, err
		}
		types, err := kwokInstanceTypes(w.Dir, w.Zones(), benchPrice)
		if err != nil {
			return nil, nil, err
		}
		cleanup, err := kwokPool(ctx, pool, delay)
		if err != nil {
			return nil, nil, err
		}
		p, err := startKWOK(pool+".log", types, benchEnv()...)
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		return p, cleanup, waitNodePoolReady(ctx, pool)
	}},
	contenderMachineDeployment: {contenderMachineDeployment, func(tb testing.TB, ctx context.Context, pool string, _ time.Duration) (*Provider, func(), error) {
		poolIn(tb, w.Spoke.Client, pool, pool)
		mds := benchMachineDeployments(tb, pool)
		p, err := StartProviderWithEnv(bin, w, pool+".log", benchEnv())
		if err != nil {
			return nil, nil, err
		}
		waitPoolReady(tb, pool)
		return p, func() {
			for _, md := range mds {
				_ = w.Hub.Client.Delete(context.Background(), md)
			}
		}, nil
	}},
	contenderMachine: {contenderMachine, func(tb testing.TB, ctx context.Context, pool string, _ time.Duration) (*Provider, func(), error) {
		machinePool(tb, pool, machinePoolOptions{})
		memberTemplate(tb, pool, pool+"-m5-large", "m5.large", map[string]string{v1alpha1.PriceAnnotation: fmt.Sprint(benchPrice)})
		p, err := StartProviderWithEnv(bin, w, pool+".log", benchEnv())
		if err != nil {
			return nil, nil, err
		}
		waitPoolReady(tb, pool)
		return p, func() {}, nil
	}},
}

// benchBatch is core's batch window for the Karpenter contenders
// (BENCH_BATCH "idle/max", e.g. "1s/10s", core's defaults); empty keeps the
// suite's 500ms/3s (provider.go).
var benchBatch struct{ idle, max string }

// benchEnv is the environment of a Karpenter contender's process: CPU
// profiling on, and core's batch window when BENCH_BATCH sets one (a later
// entry wins over the suite's).
func benchEnv() []string {
	env := []string{"ENABLE_PROFILING=true"}
	if benchBatch.idle != "" {
		env = append(env, "BATCH_IDLE_DURATION="+benchBatch.idle, "BATCH_MAX_DURATION="+benchBatch.max)
	}
	return env
}

// benchMDs is how many MachineDeployments of the same offering and price
// the machinedeployment contender and its floor use (BENCH_MDS).
var benchMDs = 1

// benchMachineDeployments creates the pool's benchMDs MachineDeployments of
// m5.large in us-east-1a at benchPrice: <pool>-md, then <pool>-md-2 and on.
func benchMachineDeployments(tb testing.TB, pool string) []*clusterv1.MachineDeployment {
	tb.Helper()
	var out []*clusterv1.MachineDeployment
	for i := 1; i <= benchMDs; i++ {
		name := pool + "-md"
		if i > 1 {
			name = fmt.Sprintf("%s-md-%d", pool, i)
		}
		out = append(out, machineDeployment(tb, pool, name, "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: fmt.Sprint(benchPrice)}))
	}
	return out
}

// waitNodePoolReady waits until core marked the NodePool Ready (its
// NodeClass resolved): the kwok contender's equivalent of waitPoolReady.
func waitNodePoolReady(ctx context.Context, name string) error {
	return WaitFor(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		np := &karpv1.NodePool{}
		if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: name}, np); err != nil {
			return false, err
		}
		return np.StatusConditions().Root().IsTrue(), nil
	})
}

// benchOptions shape one contender's run.
type benchOptions struct {
	N          int
	Delay      time.Duration
	ProfileDir string // CPU profiles of the contender's process, when set
	// RunTimeout bounds each wait of a run (BENCH_RUN_TIMEOUT); zero: 10
	// minutes, or 3 s per node when longer.
	RunTimeout time.Duration
}

func (o benchOptions) runTimeout() time.Duration {
	if o.RunTimeout > 0 {
		return o.RunTimeout
	}
	return max(10*time.Minute, time.Duration(o.N)*3*time.Second)
}

// runBurst runs one contender: N single-pod nodes from zero and back to zero.
func runBurst(tb testing.TB, c contender, o benchOptions) runResult {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := fmt.Sprintf("sbs-%s-%d", c.name, o.N)
	app := "app-" + pool
	setProvisionDelay(tb, o.Delay)
	defer setProvisionDelay(tb, 0)

	p, cleanup, err := c.setup(tb, ctx, pool, o.Delay)
	if err != nil {
		tb.Fatalf("%s: %v", c.name, err)
	}
	defer cleanup()
	defer p.Stop()
	if err := WaitFor(ctx, time.Minute, func(context.Context) (bool, error) { _, err := p.Writes(); return err == nil, err }); err != nil {
		tb.Fatalf("%s: metrics endpoint: %v (log %s)", c.name, err, p.LogPath)
	}

	hubCache, spokeCache := worldCaches(tb)
	tl := newTimeline()
	if err := tl.watchPool(ctx, hubCache, spokeCache, pool, app); err != nil {
		tb.Fatal(err)
	}
	go func() { _ = hubCache.Start(ctx) }()
	go func() { _ = spokeCache.Start(ctx) }()
	if !hubCache.WaitForCacheSync(ctx) || !spokeCache.WaitForCacheSync(ctx) {
		tb.Fatal("caches did not sync")
	}

	r := newRunResult(c.name, o)
	if benchBatch.idle != "" {
		r.Batch = benchBatch.idle + "/" + benchBatch.max
	}
	if c.name == contenderMachineDeployment {
		r.MachineDeployments = benchMDs
	}
	before, err := p.Writes()
	if err != nil {
		tb.Fatal(err)
	}
	cpu0, _, _ := procCPU(p.Pid())
	world0 := worldCPU(p.Pid())
	cost0, err := takeCost(ctx, p.Pid())
	if err != nil {
		tb.Fatal(err)
	}
	var profWG sync.WaitGroup
	profDone := make(chan struct{})
	if o.ProfileDir != "" {
		profWG.Add(1)
		go func() { defer profWG.Done(); r.Profiles = collectProfiles(p, o.ProfileDir, pool, profDone) }()
	}

	start := time.Now()
	tl.countSurplus(true)
	d := deployment(tb, pool, app, int32(o.N), "1500m")
	timeout := o.runTimeout()
	if err := WaitFor(ctx, timeout, func(context.Context) (bool, error) { return tl.now("pod-running") >= o.N, nil }); err != nil {
		close(profDone)
		tb.Fatalf("%s: %d pods: %v; running %d, nodeclaims %d, nodes %d, machines %d (log %s)", c.name, o.N, err,
			tl.now("pod-running"), tl.now("nodeclaim"), tl.now("node"), tl.now("machine"), p.LogPath)
	}
	r.TotalS = time.Since(start).Seconds()
	starts := durations(tl.times("pod-created"), tl.times("pod-running"))
	r.PodStartP50S, r.PodStartP100S = quantile(starts, 0.5), quantile(starts, 1)
	// The Nodes were Ready before their pods ran. Cluster API copies the
	// instances' providerIDs to the Machines on its own time (a launch
	// returns on the instance's): that is waited for before the scale-down.
	r.NodesReadyS = nth(sinceStart(start, tl.times("node-ready")), o.N)
	if c.name != contenderKWOK {
		if err := WaitFor(ctx, timeout, func(context.Context) (bool, error) { return tl.count("machine-providerid") >= o.N, nil }); err != nil {
			close(profDone)
			tb.Fatalf("%s: %d Machines with a providerID: %v; %d (log %s)", c.name, o.N, err, tl.count("machine-providerid"), p.LogPath)
		}
		r.MachinesRunningS = nth(sinceStart(start, tl.times("machine-providerid")), o.N)
	}

	tl.countSurplus(false)
	downStart := time.Now()
	scaleDeployment(tb, d, 0)
	if err := WaitFor(ctx, timeout, func(context.Context) (bool, error) {
		if tl.now("node") == 0 && r.NodesGoneS == 0 {
			r.NodesGoneS = time.Since(downStart).Seconds()
		}
		return tl.now("nodeclaim") == 0 && tl.now("node") == 0 && tl.now("machine") == 0, nil
	}); err != nil {
		close(profDone)
		tb.Fatalf("%s: scale-down of %d: %v; nodeclaims %d, nodes %d, machines %d (log %s)", c.name, o.N, err,
			tl.now("nodeclaim"), tl.now("node"), tl.now("machine"), p.LogPath)
	}
	r.ScaleDownS = time.Since(downStart).Seconds()
	close(profDone)
	profWG.Wait()

	after, err := p.Writes()
	if err != nil {
		tb.Fatal(err)
	}
	cpu1, _, _ := procCPU(p.Pid())
	r.CPUS = cpu1 - cpu0
	r.WorldCPUS = worldCPU(p.Pid()) - world0
	cost1, err := takeCost(ctx, p.Pid())
	if err != nil {
		tb.Fatal(err)
	}
	r.setCost(cost1.since(cost0))
	if r.PeakRSSMiB, err = peakRSSMiB(p.Pid()); err != nil {
		tb.Fatal(err)
	}
	total, hub, _ := after.sub(before).writes()
	r.HubWritesPerNode, r.SpokeWritesPerNode = hub/float64(o.N), (total-hub)/float64(o.N)
	r.PeakNodeClaims, r.PeakNodes, r.PeakMachines = tl.peakOf("nodeclaim"), tl.peakOf("node"), tl.peakOf("machine")
	r.PeakMachineSurplus = tl.surplusPeak()
	r.Breakdown, r.ClaimWaves = breakdown(tl, start)
	r.MachineZones = tl.zoneCounts()
	return r
}

// newRunResult starts a run's result: contender, N, delay, placement and
// the load average at its start.
func newRunResult(contender string, o benchOptions) runResult {
	r := runResult{Contender: contender, N: o.N, DelayS: o.Delay.Seconds(), LoadAvg: loadAvg(), Placement: benchPlacement}
	if benchSplit != nil {
		r.HubCPUSet, r.WorkloadCPUSet = benchSplit.HubCPUs.String(), benchSplit.WorkloadCPUs.String()
	}
	return r
}

// setProvisionDelay sets the simulated instances' boot time (the world's
// side process's in a split world).
func setProvisionDelay(tb testing.TB, d time.Duration) {
	tb.Helper()
	if err := w.SetProvisionDelay(d); err != nil {
		tb.Fatal(err)
	}
}

// nth is the n-th smallest of sorted values (the time the n-th object
// reached a stage), 0 when fewer reached it.
func nth(sorted []float64, n int) float64 {
	if n <= 0 || len(sorted) < n {
		return 0
	}
	return sorted[n-1]
}

// breakdown is where a run's time went, from the timeline.
func breakdown(tl *timeline, start time.Time) (map[string][2]float64, string) {
	out := map[string][2]float64{}
	pq := func(name string, v []float64) {
		if len(v) > 0 {
			out[name] = [2]float64{quantile(v, 0.5), quantile(v, 1)}
		}
	}
	pq("deployment -> pod created", sinceStart(start, tl.times("pod-created")))
	pq("deployment -> nodeclaim created", sinceStart(start, tl.times("claim-created")))
	pq("nodeclaim created -> launched (Create returned)", durations(tl.times("claim-created"), tl.times("claim-launched")))
	pq("deployment -> Machine created", sinceStart(start, tl.times("machine-created")))
	pq("Machine created -> instance providerID", durations(tl.times("machine-created"), tl.times("instance-providerid")))
	pq("instance providerID -> Machine providerID", durations(tl.times("instance-providerid"), tl.times("machine-providerid")))
	pq("nodeclaim launched -> registered", durations(tl.times("claim-launched"), tl.times("claim-registered")))
	pq("nodeclaim registered -> initialized", durations(tl.times("claim-registered"), tl.times("claim-initialized")))
	pq("node created -> Ready", durations(tl.times("node-created"), tl.times("node-ready")))
	pq("pod created -> bound", durations(tl.times("pod-created"), tl.times("pod-bound")))
	pq("pod bound -> Running", durations(tl.times("pod-bound"), tl.times("pod-running")))
	return out, waves(sinceStart(start, tl.times("claim-created")), 1)
}

// collectProfiles fetches 20-second CPU profiles of the process until done.
func collectProfiles(p *Provider, dir, prefix string, done <-chan struct{}) []string {
	var files []string
	for i := 0; ; i++ {
		select {
		case <-done:
			return files
		default:
		}
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=20", p.MetricsPort))
		if err != nil {
			return files
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return files
		}
		path := filepath.Join(dir, fmt.Sprintf("%s-%02d.pprof", prefix, i))
		if os.WriteFile(path, body, 0o644) == nil {
			files = append(files, path)
		}
	}
}

func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	s := string(raw)
	if len(s) > 14 {
		s = s[:14]
	}
	return s
}
