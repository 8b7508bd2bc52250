package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/failpoint"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// failpointRun starts the provider with the failpoint "<step>:<n>" (or none
// when step is empty) in place of the running one.
func failpointRun(t *testing.T, step string, n int) *Provider {
	t.Helper()
	if !provider.Exited() {
		provider.Kill()
	}
	var env []string
	if step != "" {
		env = []string{fmt.Sprintf("%s=%s:%d", failpoint.CrashAfterEnv, step, n)}
	}
	p, err := StartProviderWithEnv(bin, w, "provider.log", env)
	if err != nil {
		t.Fatal(err)
	}
	provider = p
	return p
}

// restoreProvider leaves a provider without failpoint running after the test.
func restoreProvider(t *testing.T) {
	t.Cleanup(func() {
		if !provider.Exited() {
			provider.Kill()
		}
		p, err := StartProvider(bin, w, "provider.log")
		if err != nil {
			t.Fatal(err)
		}
		provider = p
	})
}

type stop struct {
	step string
	n    int
}

// runFailpoints runs the plan: each entry starts the provider with its
// failpoint and waits until the process stops there (an injected crash) or
// done holds (the step was not reached again). It returns the stops made.
func runFailpoints(t *testing.T, plan []stop, done func(context.Context) (bool, error)) []stop {
	t.Helper()
	var made []stop
	for _, s := range plan {
		if ok, err := done(context.Background()); err == nil && ok {
			break
		}
		p := failpointRun(t, s.step, s.n)
		err := WaitFor(context.Background(), 3*time.Minute, func(ctx context.Context) (bool, error) {
			if p.Exited() {
				return true, nil
			}
			return done(ctx)
		})
		if err != nil {
			t.Fatalf("the provider neither stopped at %s:%d nor finished: %v", s.step, s.n, err)
		}
		if p.Exited() {
			made = append(made, s)
			t.Logf("stopped at %s:%d", s.step, s.n)
		}
	}
	return made
}

// The provider is killed after each step of a launch (choice recorded,
// replica raised, Machine bound, before returning) and of a termination
// (Machine marked, replica given back), over and over, while 20 NodeClaims
// launch on one MachineDeployment and then terminate: afterwards Machines,
// NodeClaims and Nodes match, the replicas equal the bound Machines, no
// Machine is left unbound and none was created twice.
func TestMachineDeploymentKillAtEachStep(t *testing.T) {
	const n = 20
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	restoreProvider(t)
	t.Cleanup(func() { w.AWS.SetProvisionDelay(world.DefaultProvisionDelay) })
	pool(t, "faults")
	md := machineDeployment(t, "faults", "faults-m5-large", "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	mds := []*clusterv1.MachineDeployment{md}

	// Every Machine ever created for the MachineDeployment.
	hubCache, _ := worldCaches(t)
	machinesMade := countMachinesMade(ctx, t, hubCache, md.Name)
	go func() { _ = hubCache.Start(ctx) }()
	hubCache.WaitForCacheSync(ctx)

	start := time.Now()
	d := deployment(t, "faults", "app-faults", n, "1500m")
	up := func(ctx context.Context) (bool, error) {
		c, err := count(ctx, "faults", "app-faults", mds...)
		return err == nil && c.RunningPods == n && c.Initialized == n, err
	}
	// Instances take a while: launches stay in flight across several stops.
	// The first four stops visit each launch step once, in the order a
	// launch goes through them, so each is certain to be reached: a process
	// stopping at "choose" or "reserve" stops at its first, before any
	// Machine is bound, and one stopping at "bind" before any launch of its
	// own returns. Later stops wait for the n-th step of a process; how many
	// of those come before the scale-up is done depends on how much work
	// the earlier processes finished, so they are not counted on.
	w.AWS.SetProvisionDelay(10 * time.Second)
	stops := runFailpoints(t, []stop{
		{machinedeployment.StepChoose, 1}, {machinedeployment.StepReserve, 1}, {machinedeployment.StepBind, 1}, {machinedeployment.StepLaunched, 1},
		{machinedeployment.StepChoose, 2}, {machinedeployment.StepReserve, 2}, {machinedeployment.StepBind, 2}, {machinedeployment.StepLaunched, 2},
		{machinedeployment.StepBind, 3}, {machinedeployment.StepLaunched, 3}, {machinedeployment.StepBind, 2}, {machinedeployment.StepLaunched, 2},
	}, up)
	w.AWS.SetProvisionDelay(world.DefaultProvisionDelay)
	upStops := len(stops)
	failpointRun(t, "", 0)
	got := waitCounts(t, 6*time.Minute, "faults", "app-faults", mds, func(c counts) bool {
		return c.RunningPods == n && c.Initialized == n && c.Pending == 0 && c.UnboundMachines == 0
	})
	t.Logf("scale-up with %d stops done after %s: %s", upStops, time.Since(start).Round(time.Second), got)
	if got.NodeClaims != n || got.Nodes != n || got.Machines != n || got.BoundMachines != n || got.Replicas != n {
		t.Fatalf("want exactly %d NodeClaims, Nodes, Machines (all bound) and replicas, got %s", n, got)
	}
	if v := ownedReplicas(t, md); v != fmt.Sprint(n) {
		t.Fatalf("owned replicas %q after the scale-up, want %d", v, n)
	}
	// Nothing extra shows up during the grace period either.
	holdCounts(t, machinedeployment.OrphanGrace+5*time.Second, "faults", "app-faults", mds, func(c counts) bool {
		return c.Machines == n && c.Replicas == n && c.UnboundMachines == 0 && c.NodeClaims == n
	})

	// Five nodes at a time: terminations stay in flight across several stops.
	np := &karpv1.NodePool{}
	if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: "faults"}, np); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(np.DeepCopy())
	np.Spec.Disruption.Budgets = []karpv1.Budget{{Nodes: "5"}}
	if err := w.Spoke.Client.Patch(ctx, np, patch); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	scaleDeployment(t, d, 0)
	empty := func(ctx context.Context) (bool, error) {
		c, err := count(ctx, "faults", "app-faults", mds...)
		return err == nil && c.NodeClaims == 0 && c.Machines == 0 && c.Nodes == 0 && c.Replicas == 0, err
	}
	stops = append(stops, runFailpoints(t, []stop{
		{machinedeployment.StepMark, 1}, {machinedeployment.StepRelease, 1}, {machinedeployment.StepMark, 2}, {machinedeployment.StepRelease, 2},
		{machinedeployment.StepMark, 1}, {machinedeployment.StepRelease, 1}, {machinedeployment.StepMark, 2}, {machinedeployment.StepRelease, 2},
		{machinedeployment.StepMark, 1}, {machinedeployment.StepRelease, 1}, {machinedeployment.StepMark, 2}, {machinedeployment.StepRelease, 2},
		{machinedeployment.StepMark, 1}, {machinedeployment.StepRelease, 1},
	}, empty)...)
	failpointRun(t, "", 0)
	got = waitCounts(t, 6*time.Minute, "faults", "app-faults", mds, func(c counts) bool {
		return c.NodeClaims == 0 && c.Machines == 0 && c.Nodes == 0 && c.Replicas == 0 && c.Pending == 0
	})
	t.Logf("scale-down with %d stops done after %s: %s", len(stops)-upStops, time.Since(start).Round(time.Second), got)

	if v := ownedReplicas(t, md); v != "0" {
		t.Fatalf("owned replicas %q after the scale-down, want 0", v)
	}
	perStep := map[string]int{}
	for _, s := range stops {
		perStep[s.step]++
	}
	total := machinesMade()
	t.Logf("%d injected stops %v; %d Machines created in all; %d ReplicasChanged events", len(stops), perStep, total, mdEvents(t, md, "ReplicasChanged"))
	if len(stops) < 10 {
		t.Fatalf("only %d injected stops (%v): want at least 10", len(stops), perStep)
	}
	for _, step := range []string{machinedeployment.StepChoose, machinedeployment.StepReserve, machinedeployment.StepBind,
		machinedeployment.StepLaunched, machinedeployment.StepMark, machinedeployment.StepRelease} {
		if perStep[step] == 0 {
			t.Errorf("no stop after step %s", step)
		}
	}
	if total != n {
		t.Errorf("%d Machines were created for %d NodeClaims: want exactly one each", total, n)
	}
}

// holdCounts checks the pool's counts every half second for d and fails as
// soon as want does not hold.
func holdCounts(t testing.TB, d time.Duration, pool, app string, mds []*clusterv1.MachineDeployment, want func(counts) bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		c, err := count(context.Background(), pool, app, mds...)
		if err != nil {
			t.Fatal(err)
		}
		if !want(c) {
			t.Fatalf("pool %s: counts changed: %s", pool, c)
		}
		<-tick.C
	}
}

func ownedReplicas(t testing.TB, md *clusterv1.MachineDeployment) string {
	t.Helper()
	cur := &clusterv1.MachineDeployment{}
	if err := w.Hub.Client.Get(context.Background(), client.ObjectKeyFromObject(md), cur); err != nil {
		t.Fatal(err)
	}
	return cur.Annotations[machinedeployment.OwnedReplicasAnnotation]
}

// mdEvents counts the hub's events with the reason on the MachineDeployment.
func mdEvents(t testing.TB, md *clusterv1.MachineDeployment, reason string) int {
	t.Helper()
	events := &corev1.EventList{}
	if err := w.Hub.Client.List(context.Background(), events, client.InNamespace(md.Namespace)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range events.Items {
		if e.Reason == reason && e.InvolvedObject.Kind == "MachineDeployment" && e.InvolvedObject.Name == md.Name {
			n += int(max(e.Count, 1))
		}
	}
	return n
}

// countMachinesMade counts every Machine of the MachineDeployment named md
// that the (unstarted) hub cache sees created, from its start on.
func countMachinesMade(ctx context.Context, t testing.TB, hubCache cache.Cache, md string) func() int {
	t.Helper()
	inf, err := hubCache.GetInformer(ctx, &clusterv1.Machine{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	created := map[string]bool{}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: func(o any) {
		if m, ok := o.(*clusterv1.Machine); ok && m.Labels[clusterv1.MachineDeploymentNameLabel] == md {
			mu.Lock()
			created[m.Name] = true
			mu.Unlock()
		}
	}}); err != nil {
		t.Fatal(err)
	}
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(created)
	}
}
