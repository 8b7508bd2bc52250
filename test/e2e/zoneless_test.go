package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// A worker MachineDeployment as clusterctl templates write it: no failure
// domain. The last round's provider never launched on it (84 failed
// launches in 4 minutes): offerings were looked up by a random zone. Pods
// must get exactly one node each, no launch may fail (every NodeClaim ever
// created is one of the final ones), and each NodeClaim learns its zone
// from its Node.
func TestMachineDeploymentWithoutFailureDomain(t *testing.T) {
	pool(t, "nz")
	md := machineDeployment(t, "nz", "nz-m5-large", "m5.large", "", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	mds := []*clusterv1.MachineDeployment{md}
	seen := watchNodeClaimNames(t, "nz")
	d := deployment(t, "nz", "app-nz", 4, "1500m")

	got := waitCounts(t, 4*time.Minute, "nz", "app-nz", mds, func(c counts) bool {
		return c.RunningPods == 4 && c.Initialized == 4 && c.Nodes == 4 && c.BoundMachines == 4 && c.Zones[w.AWS.Zones()[0]] == 4
	})
	if got.NodeClaims != 4 || got.Machines != 4 || got.Replicas != 4 || got.UnboundMachines != 0 {
		t.Fatalf("want exactly 4 NodeClaims, Machines (all bound) and replicas, got %s", got)
	}
	if n := len(seen()); n != 4 {
		t.Fatalf("%d NodeClaims were created for 4 pods: launches failed and were retried (%v)", n, seen())
	}

	scaleDeployment(t, d, 0)
	waitCounts(t, 4*time.Minute, "nz", "app-nz", mds, func(c counts) bool {
		return c.NodeClaims == 0 && c.Nodes == 0 && c.Machines == 0 && c.Replicas == 0
	})
}

// watchNodeClaimNames records every NodeClaim of the pool that exists at
// any poll (every 200 ms) until the test ends, and returns a reader.
func watchNodeClaimNames(t *testing.T, pool string) func() map[string]bool {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	names := map[string]bool{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			ncs := &karpv1.NodeClaimList{}
			if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err == nil {
				mu.Lock()
				for _, nc := range ncs.Items {
					names[nc.Name] = true
				}
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func() map[string]bool {
		mu.Lock()
		defer mu.Unlock()
		out := make(map[string]bool, len(names))
		for k := range names {
			out[k] = true
		}
		return out
	}
}
