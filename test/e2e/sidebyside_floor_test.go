package e2e

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes/scheme"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/launch"
	"github.com/autonode/karpenter-clusterapi/pkg/machine"
)

// A Cluster API floor is a contender without Karpenter: the fixtures of
// the mode it is the floor of, in the same world settings, and Cluster API
// given at once everything that mode asks of it over a burst of N. Its time
// from that write to N Nodes Ready is what Cluster API, the simulated
// instances and kubelet and the API servers need on this machine; a mode
// can come near it only by overlapping Karpenter's decisions with Cluster
// API's work. There is no process of its own: the world's CPU over the run
// is what it costs (the floor's own writes, made from this test process,
// are in it).

// floor is one Cluster API floor.
type floor struct {
	name string
	of   string // the mode it is the floor of
	// setup creates the mode's fixtures for a burst of n and returns the
	// writes that take the pool to n and back to 0.
	setup func(tb testing.TB, ctx context.Context, pool string, n int) floorWrites
}

// floorWrites bring a floor's pool to N and back to 0 (each returns once
// its writes are made, not once Cluster API has acted on them); cleanup
// removes what the run leaves (the mode's contender cleans up alike).
type floorWrites struct {
	up, down func(ctx context.Context) error
	cleanup  func()
}

var floors = map[string]floor{
	contenderFloorMD:       {contenderFloorMD, contenderMachineDeployment, machineDeploymentFloor},
	contenderFloorMachines: {contenderFloorMachines, contenderMachine, machinesFloor},
}

// floorOf is the floor contender of a mode ("" for kwok).
func floorOf(mode string) string {
	for name, f := range floors {
		if f.of == mode {
			return name
		}
	}
	return ""
}

// machineDeploymentFloor: the very MachineDeployments the machinedeployment
// contender uses (pool <pool>-md and, with BENCH_MDS, <pool>-md-2 on:
// Karpenter members that no Karpenter watches now), each scaled from 0 to
// its share of N (N split as evenly as it goes) at once, and back to 0.
func machineDeploymentFloor(tb testing.TB, ctx context.Context, pool string, n int) floorWrites {
	tb.Helper()
	poolIn(tb, w.Spoke.Client, pool, pool)
	mds := benchMachineDeployments(tb, pool)
	// The mode's run starts once its pool is ready, by when Cluster API has
	// made the MachineDeployments' MachineSets: so does the floor's.
	for _, md := range mds {
		if err := WaitFor(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
			sets := &clusterv1.MachineSetList{}
			err := w.Hub.Client.List(ctx, sets, client.InNamespace(w.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name})
			return err == nil && len(sets.Items) == 1, err
		}); err != nil {
			tb.Fatalf("%s: MachineDeployment %s has no MachineSet: %v", pool, md.Name, err)
		}
	}
	scale := func(total int) func(context.Context) error {
		return func(ctx context.Context) error {
			errs := make(chan error, len(mds))
			for i, md := range mds {
				share := total / len(mds)
				if i < total%len(mds) {
					share++
				}
				go func() {
					patch := client.RawPatch(client.Merge.Type(), fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, share))
					if err := w.Hub.Client.Patch(ctx, md.DeepCopy(), patch); err != nil {
						errs <- fmt.Errorf("scaling MachineDeployment %s/%s to %d: %w", md.Namespace, md.Name, share, err)
						return
					}
					errs <- nil
				}()
			}
			var first error
			for range mds {
				if err := <-errs; err != nil && first == nil {
					first = err
				}
			}
			return first
		}
	}
	return floorWrites{up: scale(n), down: scale(0), cleanup: func() {
		for _, md := range mds {
			_ = w.Hub.Client.Delete(context.Background(), md)
		}
	}}
}

// machinesFloor: the machine contender's NodeClass and template, and N
// standalone Machines (each with its AWSMachine) cloned by Machine mode's
// own code (machine.Clone) from the offering Machine mode would choose,
// created all at once; then all deleted at once, as Machine mode releases
// them.
func machinesFloor(tb testing.TB, ctx context.Context, pool string, n int) floorWrites {
	tb.Helper()
	nc := machinePool(tb, pool, machinePoolOptions{})
	memberTemplate(tb, pool, pool+"-m5-large", "m5.large", map[string]string{v1alpha1.PriceAnnotation: fmt.Sprint(benchPrice)})
	clones, err := machineClones(ctx, nc, pool, n)
	if err != nil {
		tb.Fatalf("%s: %v", pool, err)
	}
	up := func(ctx context.Context) error {
		return each(ctx, clones, func(ctx context.Context, c launchObjects) error {
			// In the order of a launch: the infrastructure machine, then
			// the Machine referencing it.
			if err := w.Hub.Client.Create(ctx, c.infra.DeepCopy()); err != nil {
				return fmt.Errorf("creating %s %s: %w", c.infra.GetKind(), c.infra.GetName(), err)
			}
			if err := w.Hub.Client.Create(ctx, c.machine.DeepCopy()); err != nil {
				return fmt.Errorf("creating Machine %s: %w", c.machine.Name, err)
			}
			return nil
		})
	}
	down := func(ctx context.Context) error {
		return each(ctx, clones, func(ctx context.Context, c launchObjects) error {
			return client.IgnoreNotFound(w.Hub.Client.Delete(ctx, c.machine.DeepCopy()))
		})
	}
	cleanup := func() { // after a failed run: nothing is left otherwise
		_ = w.Hub.Client.DeleteAllOf(context.Background(), &clusterv1.Machine{}, client.InNamespace(w.Namespace), client.MatchingLabels{"pool": pool})
	}
	return floorWrites{up: up, down: down, cleanup: cleanup}
}

// launchObjects are what Machine mode creates for one NodeClaim.
type launchObjects struct {
	infra   *unstructured.Unstructured
	machine *clusterv1.Machine
}

// machineClones builds the objects of n launches of the Machine-mode
// NodeClass nc with the provider's own code: the NodeClass resolved by its
// catalogue over a hub cache like the provider's, the offering Machine mode
// chooses for the bench's NodeClaims (the cheapest launchable on-demand
// m5.large offering; among equal prices the first, as its chooser does),
// and each launch's clone. The hub cache stops before the run.
func machineClones(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass, pool string, n int) ([]launchObjects, error) {
	if nc.Spec.MachineTemplate.Bootstrap.ConfigRef != nil {
		return nil, fmt.Errorf("ClusterAPINodeClass %s: the floor clones only NodeClasses that bootstrap from a data Secret", nc.Name)
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	h, err := hub.New(w.Hub.Config, scheme.Scheme, hub.Scope{Namespace: w.Namespace, ClusterName: w.ClusterName})
	if err != nil {
		return nil, err
	}
	go func() { _ = h.Start(ctx) }()
	if !h.GetCache().WaitForCacheSync(ctx) {
		return nil, errors.New("the hub cache did not sync")
	}
	catalogue, err := machine.NewCatalogue(ctx, h, launch.NewUnavailable(time.Minute, nil), nil)
	if err != nil {
		return nil, err
	}
	var resolved *machine.Resolved
	var src instancetype.Source
	// The template's status (its capacity) is written after its creation:
	// wait until the catalogue offers it.
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		var err error
		if resolved, err = catalogue.Resolve(ctx, nc); err != nil {
			return false, err
		}
		var ok bool
		src, ok = chosenOffering(resolved.Set, "m5.large", karpv1.CapacityTypeOnDemand)
		return ok, nil
	}); err != nil {
		return nil, fmt.Errorf("resolving ClusterAPINodeClass %s: %w", nc.Name, err)
	}
	offering := machine.Offering{Template: src.Origin, Zone: src.Zone, CapacityType: src.CapacityType}
	bootstrap := clusterv1.Bootstrap{DataSecretName: nc.Spec.MachineTemplate.Bootstrap.DataSecretName}
	out := make([]launchObjects, 0, n)
	for i := range n {
		// Claim names shaped like core's (<nodepool>-<5 characters>).
		c, err := machine.NewClone(ctx, h, nc, resolved.Template, src, offering, fmt.Sprintf("%s-%05d", pool, i), 0)
		if err != nil {
			return nil, err
		}
		infra, err := c.InfraMachine()
		if err != nil {
			return nil, err
		}
		out = append(out, launchObjects{infra: infra, machine: c.Machine(bootstrap, nil)})
	}
	return out, nil
}

// chosenOffering is the offering of instance type name and capacity type
// that the provider's chooser (pkg/cloudprovider cheapest) picks for a
// NodeClaim that allows any zone: the cheapest launchable one, the first
// among equal prices, launched from its first available source.
func chosenOffering(set *instancetype.Set, name, capacityType string) (instancetype.Source, bool) {
	for _, it := range set.InstanceTypes {
		if it.Name != name {
			continue
		}
		var best *instancetype.Source
		bestPrice := 0.0
		for _, of := range it.Offerings.Launchable() {
			if !of.Requirements.Get(karpv1.CapacityTypeLabelKey).Has(capacityType) {
				continue
			}
			for _, s := range set.Origins[instancetype.KeyOf(it.Name, of)] {
				if !s.Available {
					continue
				}
				if best == nil || of.Price < bestPrice {
					best, bestPrice = &s, of.Price
				}
				break
			}
		}
		if best != nil {
			return *best, true
		}
	}
	return instancetype.Source{}, false
}

// launchesInFlight is how many NodeClaims Karpenter core launches at once
// (its NodeClaim lifecycle controller's 1 000 reconciles at least).
const launchesInFlight = 1000

// each runs f on every launch at once (launchesInFlight at a time) and
// returns the first error.
func each(ctx context.Context, launches []launchObjects, f func(context.Context, launchObjects) error) error {
	sem := make(chan struct{}, launchesInFlight)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for _, l := range launches {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := f(ctx, l); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// runFloor runs one floor: the write to N, N Nodes Ready, the write to 0,
// no Machine and no Node left.
func runFloor(tb testing.TB, f floor, o benchOptions) runResult {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := fmt.Sprintf("sbs-%s-%d", f.name, o.N)
	setProvisionDelay(tb, o.Delay)
	defer setProvisionDelay(tb, 0)
	writes := f.setup(tb, ctx, pool, o.N)
	defer writes.cleanup()

	hubCache, spokeCache := worldCaches(tb)
	tl := newTimeline()
	if err := tl.watchMachines(ctx, hubCache, pool); err != nil {
		tb.Fatal(err)
	}
	if err := tl.watchInstanceNodes(ctx, spokeCache); err != nil {
		tb.Fatal(err)
	}
	go func() { _ = hubCache.Start(ctx) }()
	go func() { _ = spokeCache.Start(ctx) }()
	if !hubCache.WaitForCacheSync(ctx) || !spokeCache.WaitForCacheSync(ctx) {
		tb.Fatal("caches did not sync")
	}

	r := newRunResult(f.name, o)
	r.FloorOf = f.of
	if f.name == contenderFloorMD {
		r.MachineDeployments = benchMDs
	}
	world0 := worldCPU(0)
	cost0, err := takeCost(ctx, 0)
	if err != nil {
		tb.Fatal(err)
	}
	timeout := o.runTimeout()
	start := time.Now()
	if err := writes.up(ctx); err != nil {
		tb.Fatalf("%s: %v", f.name, err)
	}
	// N Nodes Ready is the figure; Cluster API copies the providerIDs to
	// the Machines on its own time, which is waited for too, so that the
	// time to N Machines with a providerID is known before the scale-down.
	if err := WaitFor(ctx, timeout, func(context.Context) (bool, error) {
		if r.TotalS == 0 && len(tl.poolNodes("instance-node-ready")) >= o.N {
			r.TotalS = time.Since(start).Seconds()
		}
		return r.TotalS > 0 && tl.count("machine-providerid") >= o.N, nil
	}); err != nil {
		tb.Fatalf("%s: %d Nodes Ready and Machines with a providerID: %v; machines %d (with providerID %d), nodes %d, ready %d (world logs %v)", f.name, o.N, err,
			tl.now("machine"), tl.count("machine-providerid"), tl.poolNodesNow(), len(tl.poolNodes("instance-node-ready")), w.LogFiles())
	}
	ready := sinceStart(start, tl.poolNodes("instance-node-ready"))
	r.PodStartP50S, r.PodStartP100S = quantile(ready, 0.5), quantile(ready, 1)
	r.NodesReadyS = nth(ready, o.N)
	r.MachinesRunningS = nth(sinceStart(start, tl.times("machine-providerid")), o.N)

	downStart := time.Now()
	if err := writes.down(ctx); err != nil {
		tb.Fatalf("%s: %v", f.name, err)
	}
	if err := WaitFor(ctx, timeout, func(context.Context) (bool, error) {
		if tl.poolNodesNow() == 0 && r.NodesGoneS == 0 {
			r.NodesGoneS = time.Since(downStart).Seconds()
		}
		return tl.poolNodesNow() == 0 && tl.now("machine") == 0, nil
	}); err != nil {
		tb.Fatalf("%s: back to 0: %v; machines %d, nodes %d (world logs %v)", f.name, err, tl.now("machine"), tl.poolNodesNow(), w.LogFiles())
	}
	r.ScaleDownS = time.Since(downStart).Seconds()
	r.WorldCPUS = worldCPU(0) - world0
	cost1, err := takeCost(ctx, 0)
	if err != nil {
		tb.Fatal(err)
	}
	r.setCost(cost1.since(cost0))
	r.PeakNodes, r.PeakMachines = tl.poolNodesPeak(), tl.peakOf("machine")
	r.Breakdown = floorBreakdown(tl, start)
	r.MachineZones = tl.zoneCounts()
	return r
}

// floorBreakdown is where a floor's time went, from the timeline.
func floorBreakdown(tl *timeline, start time.Time) map[string][2]float64 {
	out := map[string][2]float64{}
	pq := func(name string, v []float64) {
		if len(v) > 0 {
			out[name] = [2]float64{quantile(v, 0.5), quantile(v, 1)}
		}
	}
	pq("write -> Machine created", sinceStart(start, tl.times("machine-created")))
	pq("Machine created -> instance providerID", durations(tl.times("machine-created"), tl.times("instance-providerid")))
	pq("instance providerID -> Machine providerID", durations(tl.times("instance-providerid"), tl.times("machine-providerid")))
	pq("write -> Node created", sinceStart(start, tl.poolNodes("instance-node-created")))
	pq("node created -> Ready", durations(tl.poolNodes("instance-node-created"), tl.poolNodes("instance-node-ready")))
	pq("write -> Node Ready", sinceStart(start, tl.poolNodes("instance-node-ready")))
	return out
}
