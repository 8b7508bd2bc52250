package e2eha

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/test/ha"
)

// spokeOutage is how long the workload cluster's API server stays down.
const spokeOutage = 2 * time.Minute

// spokeRecoveryTarget is how soon after the workload cluster's return a
// pod that needs a node gets one launched.
const spokeRecoveryTarget = 30 * time.Second

// The workload cluster's API server dies for two minutes while nodes run and
// pods wait for nodes being launched, in both modes at once (a pool each).
// The provider cannot see NodeClaims, Nodes or pods meanwhile: it must not
// take that for their absence. Nothing in the hub is deleted or scaled
// down, launches resume within spokeRecoveryTarget of the return, and no
// NodeClaim or Machine is made twice.
func TestSpokeOutage(t *testing.T) {
	ctx := context.Background()
	pools := map[ha.Mode]string{ha.MachineMode: "so-m", ha.MachineDeploymentMode: "so-md"}
	rs, _ := replicas(t)
	apps := map[ha.Mode]*appsv1.Deployment{}
	for mode, name := range pools {
		pool(t, name, ha.PoolOptions{Mode: mode})
		apps[mode] = app(t, name, "app-"+name, 4)
	}
	for _, name := range pools {
		waitCounts(t, 4*time.Minute, name, "app-"+name, func(c ha.Counts) bool { return c.RunningPods == 4 && c.Settled(4) })
	}
	watch, err := ha.WatchHub(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()

	// Pods waiting for nodes being launched when the API server dies.
	before := map[string]types.UID{}
	for mode, name := range pools {
		scale(t, apps[mode], 6)
		if err := waitFor(ctx, time.Minute, func(c ha.Counts) bool { return c.NodeClaims > 4 }, name); err != nil {
			t.Fatalf("no launch began for the 2 new pods of %s: %v", name, err)
		}
	}
	for _, name := range pools {
		m, err := machinesByName(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range m {
			before[k] = v
		}
		c, _ := ha.Count(ctx, w, name, "app-"+name)
		t.Logf("pool %s before the outage: %s", name, c)
	}
	if err := w.StopSpokeAPIServer(); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	back := false
	t.Cleanup(func() {
		if !back {
			if err := w.StartSpokeAPIServer(context.Background()); err != nil {
				t.Errorf("restarting the spoke API server: %v", err)
			}
		}
	})
	tick := time.NewTicker(5 * time.Second)
	for time.Since(down) < spokeOutage {
		select {
		case <-tick.C:
		case <-time.After(spokeOutage - time.Since(down)):
		}
		if bad := destructive(watch.Events(down)); len(bad) > 0 {
			t.Fatalf("destructive hub writes during the spoke outage (%s in): %v", time.Since(down).Round(time.Second), bad)
		}
	}
	tick.Stop()
	if err := w.StartSpokeAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	back = true
	returned := time.Now()
	t.Logf("spoke API server back after %s; replica restarts so far %v", returned.Sub(down).Round(time.Second), rs.Restarts())
	// A pod that needs a node after the return, in each pool.
	for mode := range pools {
		scale(t, apps[mode], 7)
	}
	for mode, name := range pools {
		final := waitCounts(t, 4*time.Minute, name, "app-"+name, func(c ha.Counts) bool { return c.RunningPods == 7 && c.Settled(7) })
		launch, ok := watch.First(returned, name, launchKinds[mode]...)
		if !ok {
			t.Fatalf("%s: no launch after the return", name)
		}
		recovery := launch.At.Sub(returned)
		t.Logf("HA-FIGURE spoke-outage mode=%s return->first-launch-step=%s (%s) restarts=%v final: %s",
			mode, recovery.Round(100*time.Millisecond), launch, rs.Restarts(), final)
		if recovery > spokeRecoveryTarget {
			t.Errorf("%s: first launch %s after the spoke's return, want within %s", name, recovery.Round(100*time.Millisecond), spokeRecoveryTarget)
		}
	}
	if bad := destructive(watch.Events(down)); len(bad) > 0 {
		t.Errorf("destructive hub writes during or after the spoke outage: %v", bad)
	}
	// The Machines of before are the same objects.
	after := map[string]types.UID{}
	for _, name := range pools {
		m, err := machinesByName(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range m {
			after[k] = v
		}
	}
	for n, uid := range before {
		if after[n] != uid {
			t.Errorf("Machine %s of before the outage was replaced or deleted", n)
		}
	}
}

// destructive returns the deletions and replica decreases among events.
func destructive(events []ha.HubEvent) []ha.HubEvent {
	var out []ha.HubEvent
	for _, e := range events {
		switch e.Kind {
		case "MachineDeleting", "MachineDeleted", "ReplicasLowered", "MachineDeploymentDeleted":
			out = append(out, e)
		}
	}
	return out
}

func machinesByName(ctx context.Context, pool string) (map[string]types.UID, error) {
	list := &clusterv1.MachineList{}
	if err := w.Hub.Client.List(ctx, list, client.InNamespace(w.Namespace), client.MatchingLabels{"pool": pool}); err != nil {
		return nil, err
	}
	out := map[string]types.UID{}
	for _, m := range list.Items {
		out[m.Name] = m.UID
	}
	return out, nil
}

func waitFor(ctx context.Context, timeout time.Duration, want func(ha.Counts) bool, pool string) error {
	return waitUntil(ctx, timeout, func(ctx context.Context) (bool, error) {
		c, err := ha.Count(ctx, w, pool, "")
		return err == nil && want(c), err
	})
}
