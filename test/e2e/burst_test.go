package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// BenchmarkBurst200 measures a burst of 200 NodeClaims in MachineDeployment
// mode: one member MachineDeployment (m5.large) and a Deployment of 200 pods
// that fit one per node. It reports
//
//   - machines: Machines created for the MachineDeployment (target: exactly
//     200, none unbound);
//   - writes/node: API writes (POST, PUT, PATCH, DELETE) the provider process
//     made to hub and spoke from Deployment creation until 200 NodeClaims are
//     Initialized, per node, from the client-go request counters on the
//     provider's metrics endpoint (see requestCounts). Karpenter core runs in
//     the same process, so core's own writes (NodeClaims, their status, Node
//     labels and taints, events) are included; hub-writes/node counts only
//     the writes to the hub, i.e. the Cluster API side;
//   - wall/infra: wall time from Deployment creation to 200 NodeClaims
//     Initialized, divided by the time the same world needs without Karpenter
//     to bring a MachineDeployment from 0 to 200 Ready Nodes (measured first,
//     with the same simulated provisioning delay). That time is the
//     infrastructure's own time: the simulated instance delay plus what
//     Cluster API's controllers, the simulated kubelet and the API servers
//     take for 200 Machines on this machine.
//
// Run: go test -run '^$' -bench Burst200 -benchtime 1x ./test/e2e/
func BenchmarkBurst200(b *testing.B) {
	const (
		delay = 5 * time.Second
		name  = "burst"
		app   = "app-burst"
	)
	n := 200
	if v, err := strconv.Atoi(os.Getenv("BENCH_BURST_N")); err == nil && v > 0 {
		n = v // a smaller burst for a loaded machine
	}
	nodes := float64(n)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w.AWS.SetProvisionDelay(delay)
	defer w.AWS.SetProvisionDelay(world.DefaultProvisionDelay)

	hubCache, spokeCache := worldCaches(b)
	for _, inf := range []struct {
		c cache.Cache
		o client.Object
	}{{hubCache, &clusterv1.Machine{}}, {spokeCache, &corev1.Node{}}, {spokeCache, &karpv1.NodeClaim{}}} {
		if _, err := inf.c.GetInformer(ctx, inf.o); err != nil {
			b.Fatal(err)
		}
	}
	go func() { _ = hubCache.Start(ctx) }()
	go func() { _ = spokeCache.Start(ctx) }()
	if !hubCache.WaitForCacheSync(ctx) || !spokeCache.WaitForCacheSync(ctx) {
		b.Fatal("caches did not sync")
	}

	// 1. The infrastructure's own time: a MachineDeployment that is no
	// Karpenter member, scaled from 0 to 200 directly.
	floorCPU := worldCPU(provider.Pid())
	infra := baselineScaleUp(b, ctx, hubCache, spokeCache, "burst-baseline", int32(n), delay)
	floorCPU = worldCPU(provider.Pid()) - floorCPU

	// 2. The burst through Karpenter.
	pool(b, name)
	md := machineDeployment(b, name, "burst-m5-large", "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	waitPoolReady(b, name)

	before, err := provider.Writes()
	if err != nil {
		b.Fatalf("scraping the provider's metrics: %v", err)
	}
	world0, proc0 := worldCPU(provider.Pid()), providerCPU(provider.Pid())
	start := time.Now()
	d := deployment(b, name, app, int32(n), "1500m")
	var peakMachines int
	err = WaitFor(ctx, 8*time.Minute, func(context.Context) (bool, error) {
		ms := &clusterv1.MachineList{}
		if err := hubCache.List(ctx, ms, client.InNamespace(w.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
			return false, err
		}
		peakMachines = max(peakMachines, len(ms.Items))
		ncs := &karpv1.NodeClaimList{}
		if err := spokeCache.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: name}); err != nil {
			return false, err
		}
		initialized := 0
		for _, nc := range ncs.Items {
			if nc.StatusConditions().IsTrue(karpv1.ConditionTypeInitialized) {
				initialized++
			}
		}
		return initialized >= n, nil
	})
	wall := time.Since(start)
	after, err2 := provider.Writes()
	if err != nil {
		c, _ := count(ctx, name, app, md)
		b.Fatalf("burst of %d: %v after %s; last: %s (provider log %s, world logs %v)", n, err, wall.Round(time.Millisecond), c, provider.LogPath, w.LogFiles())
	}
	if err2 != nil {
		b.Fatalf("scraping the provider's metrics: %v", err2)
	}
	// Let replicas raised late (if any) show up as Machines before counting.
	time.Sleep(5 * time.Second)
	c, err := count(ctx, name, app, md)
	if err != nil {
		b.Fatal(err)
	}
	peakMachines = max(peakMachines, c.Machines)

	total, hubWrites, bySide := after.sub(before).writes()
	ratio := wall.Seconds() / infra.Seconds()
	b.ReportMetric(float64(c.Machines), "machines")
	b.ReportMetric(float64(c.UnboundMachines), "unbound-machines")
	b.ReportMetric(float64(peakMachines), "peak-machines")
	b.ReportMetric(total/nodes, "writes/node")
	b.ReportMetric(hubWrites/nodes, "hub-writes/node")
	b.ReportMetric(wall.Seconds(), "wall-s")
	b.ReportMetric(infra.Seconds(), "infra-s")
	b.ReportMetric(ratio, "wall/infra")
	fmt.Printf("burst of %d NodeClaims, one MachineDeployment, provisioning delay %s:\n", n, delay)
	fmt.Printf("  Machines for the MachineDeployment: %d (peak %d, unbound %d); target exactly %d, none unbound\n", c.Machines, peakMachines, c.UnboundMachines, n)
	fmt.Printf("  writes per node by the provider process (hub+spoke, incl. core's NodeClaim/Node writes): %.2f; target <= 2\n", total/nodes)
	fmt.Printf("  writes per node to the hub (Cluster API) only: %.2f; by cluster, resource and verb: %s\n", hubWrites/nodes, bySide)
	fmt.Printf("  wall time Deployment -> %d NodeClaims Initialized: %s; infrastructure's own time (0 -> %d Ready Nodes without Karpenter): %s; ratio %.2f; target <= 1.2\n",
		n, wall.Round(time.Millisecond), n, infra.Round(time.Millisecond), ratio)

	// 3. Leave the world clean: scale down and wait until the pool is empty.
	downStart := time.Now()
	beforeDown := after
	scaleDeployment(b, d, 0)
	waitCounts(b, 8*time.Minute, name, app, []*clusterv1.MachineDeployment{md}, func(c counts) bool {
		return c.NodeClaims == 0 && c.Machines == 0 && c.Nodes == 0
	})
	if afterDown, err := provider.Writes(); err == nil {
		down := afterDown.sub(beforeDown)
		t, h, _ := down.writes()
		fmt.Printf("  scale-down to an empty pool took %s; writes per node %.2f (hub %.2f)\n", time.Since(downStart).Round(time.Second), t/nodes, h/nodes)
		fmt.Printf("  world CPU (API servers, Cluster API, simulators) up and down: %.1f s (%.2f s/node); the provider process: %.1f s; Cluster API alone 0 -> %d -> 0: %.1f s\n",
			worldCPU(provider.Pid())-world0, (worldCPU(provider.Pid())-world0)/nodes, providerCPU(provider.Pid())-proc0, n, floorCPU)
		fmt.Printf("  hub requests of the burst by verb and kind: %s\n", after.sub(before).hubRequests())
		fmt.Printf("  hub requests of the scale-down by verb and kind: %s\n", down.hubRequests())
	}
}

// baselineScaleUp creates a MachineDeployment that is not a Karpenter
// member, scales it from 0 to n and returns how long it took until n Nodes
// of its Machines are Ready; then scales it back to 0 and waits until its
// Machines are gone.
func baselineScaleUp(b *testing.B, ctx context.Context, hubCache, spokeCache cache.Cache, name string, n int32, delay time.Duration) time.Duration {
	b.Helper()
	if _, err := w.CreateAWSMachineTemplate(ctx, name, "m5.large", false); err != nil {
		b.Fatalf("creating AWSMachineTemplate %s: %v", name, err)
	}
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: w.Namespace, Name: name, ClusterName: w.ClusterName, FailureDomain: "us-east-1a",
	})
	if err := w.Hub.Client.Create(ctx, md); err != nil {
		b.Fatalf("creating MachineDeployment %s: %v", name, err)
	}
	b.Cleanup(func() { _ = w.Hub.Client.Delete(context.Background(), md) })
	machines := func() ([]clusterv1.Machine, error) {
		ms := &clusterv1.MachineList{}
		err := hubCache.List(ctx, ms, client.InNamespace(w.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: name})
		return ms.Items, err
	}
	scale := func(replicas int32) {
		cur := &clusterv1.MachineDeployment{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
			b.Fatal(err)
		}
		patch := client.MergeFrom(cur.DeepCopy())
		cur.Spec.Replicas = &replicas
		if err := w.Hub.Client.Patch(ctx, cur, patch); err != nil {
			b.Fatal(err)
		}
	}
	start := time.Now()
	scale(n)
	var ready, created int
	err := WaitFor(ctx, 8*time.Minute, func(context.Context) (bool, error) {
		ms, err := machines()
		if err != nil {
			return false, err
		}
		nodes := &corev1.NodeList{}
		if err := spokeCache.List(ctx, nodes); err != nil {
			return false, err
		}
		readyByID := map[string]bool{}
		for _, node := range nodes.Items {
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					readyByID[node.Spec.ProviderID] = true
				}
			}
		}
		created, ready = len(ms), 0
		for _, m := range ms {
			if m.Spec.ProviderID != "" && readyByID[m.Spec.ProviderID] {
				ready++
			}
		}
		return ready >= int(n), nil
	})
	infra := time.Since(start)
	if err != nil {
		b.Fatalf("without Karpenter, MachineDeployment %s 0 -> %d: %v; %d Machines, %d Ready Nodes after %s (world logs %v)",
			name, n, err, created, ready, infra.Round(time.Second), w.LogFiles())
	}
	fmt.Printf("without Karpenter: MachineDeployment 0 -> %d Ready Nodes in %s (provisioning delay %s)\n", n, infra.Round(time.Millisecond), delay)

	downStart := time.Now()
	scale(0)
	if err := WaitFor(ctx, 8*time.Minute, func(context.Context) (bool, error) {
		ms, err := machines()
		return err == nil && len(ms) == 0, err
	}); err != nil {
		ms, _ := machines()
		b.Fatalf("without Karpenter, MachineDeployment %s back to 0: %v; %d Machines left", name, err, len(ms))
	}
	fmt.Printf("without Karpenter: MachineDeployment back to 0 Machines in %s\n", time.Since(downStart).Round(time.Second))
	return infra
}

// waitPoolReady waits until the pool's NodeClass resolves its instance types
// and its NodePool is Ready, so that the burst's wall time does not include
// the provider discovering a MachineDeployment that was just created.
func waitPoolReady(b testing.TB, name string) {
	b.Helper()
	err := WaitFor(context.Background(), 2*time.Minute, func(ctx context.Context) (bool, error) {
		nc := &v1alpha1.ClusterAPINodeClass{}
		np := &karpv1.NodePool{}
		if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: name}, nc); err != nil {
			return false, err
		}
		if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: name}, np); err != nil {
			return false, err
		}
		return nc.StatusConditions().Root().IsTrue() && nc.Status.InstanceTypeCount > 0 && np.StatusConditions().Root().IsTrue(), nil
	})
	if err != nil {
		b.Fatalf("pool %s did not become ready: %v", name, err)
	}
}

// requestCounts are the provider's client-go request counters. Karpenter
// core replaces client-go's result metric with its own
// client_go_request_total{code,method}, which has no host label (client-go's
// rest_client_requests_total stays empty in this binary), so the hub's share
// is taken from client_go_request_duration_seconds_count{verb,group,kind},
// one observation per request: the Cluster API groups are served by the hub
// only.
type requestCounts struct {
	byMethod map[string]float64    // client_go_request_total by method
	byKind   map[[3]string]float64 // requests by verb, group, kind
}

// Writes scrapes the provider's client-go request counters.
func (p *Provider) Writes() (requestCounts, error) {
	r := requestCounts{byMethod: map[string]float64{}, byKind: map[[3]string]float64{}}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", p.MetricsPort))
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return r, err
	}
	const (
		total    = "client_go_request_total{"
		observed = "client_go_request_duration_seconds_count{"
	)
	for _, line := range strings.Split(string(body), "\n") {
		var name string
		switch {
		case strings.HasPrefix(line, total):
			name = total
		case strings.HasPrefix(line, observed):
			name = observed
		default:
			continue
		}
		labels, value, ok := strings.Cut(strings.TrimPrefix(line, name), "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		l := parseLabels(labels)
		if name == total {
			r.byMethod[l["method"]] += v
		} else {
			r.byKind[[3]string{l["verb"], l["group"], l["kind"]}] += v
		}
	}
	if len(r.byMethod) == 0 {
		return r, fmt.Errorf("no client_go_request_total on the metrics endpoint")
	}
	return r, nil
}

func (r requestCounts) sub(o requestCounts) requestCounts {
	out := requestCounts{byMethod: map[string]float64{}, byKind: map[[3]string]float64{}}
	for k, v := range r.byMethod {
		if d := v - o.byMethod[k]; d != 0 {
			out.byMethod[k] = d
		}
	}
	for k, v := range r.byKind {
		if d := v - o.byKind[k]; d != 0 {
			out.byKind[k] = d
		}
	}
	return out
}

// hubGroup reports whether an API group is served by the hub: Cluster API's
// own groups, not the NodeClass's (which lives in the spoke).
func hubGroup(g string) bool {
	return g != v1alpha1.Group && (g == "cluster.x-k8s.io" || strings.HasSuffix(g, ".cluster.x-k8s.io"))
}

// writes sums POST, PUT, PATCH and DELETE requests: all of them, those to
// the hub, and a summary by cluster, resource and verb.
func (r requestCounts) writes() (total, hub float64, summary string) {
	for m, v := range r.byMethod {
		switch m {
		case "POST", "PUT", "PATCH", "DELETE":
			total += v
		}
	}
	by := map[string]float64{}
	for k, v := range r.byKind {
		switch k[0] {
		case "CREATE", "UPDATE", "PATCH", "DELETE":
		default:
			continue
		}
		side := "spoke"
		if hubGroup(k[1]) {
			hub += v
			side = "hub"
		}
		kind := k[2]
		if k[1] != "" {
			kind += "." + k[1]
		}
		by[side+":"+kind+":"+k[0]] += v
	}
	keys := make([]string, 0, len(by))
	for k := range by {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%.0f", k, by[k]))
	}
	return total, hub, strings.Join(parts, " ")
}

// hubRequests summarizes every request to the hub (reads too: a live
// list of a MachineDeployment's Machines costs the hub more than a write) by
// verb and kind.
func (r requestCounts) hubRequests() string {
	by := map[string]float64{}
	for k, v := range r.byKind {
		if hubGroup(k[1]) {
			by[k[0]+" "+k[2]] += v
		}
	}
	keys := make([]string, 0, len(by))
	for k := range by {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%.0f", k, by[k]))
	}
	return strings.Join(parts, " ")
}

// parseLabels parses `a="x",b="y"` (values without escaped quotes).
func parseLabels(s string) map[string]string {
	out := map[string]string{}
	for s != "" {
		k, rest, ok := strings.Cut(s, "=\"")
		if !ok {
			break
		}
		v, rest, _ := strings.Cut(rest, "\"")
		out[strings.TrimPrefix(k, ",")] = v
		s = rest
	}
	return out
}

// providerCPU is the provider process's CPU seconds (0 when unreadable).
func providerCPU(pid int) float64 {
	cpu, _, err := procCPU(pid)
	if err != nil {
		return 0
	}
	return cpu
}
