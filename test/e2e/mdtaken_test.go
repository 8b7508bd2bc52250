package e2e

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
)

// Issue 35, "replicas taken away recover fast": a user lowers a member
// MachineDeployment from 3 to 1 under Karpenter's 3 nodes. The MachineSet
// removes two of Karpenter's Machines, their NodeClaims end, core makes two
// successors for the evicted pods and the provider raises again. The
// successors get nodes within a plain launch's time in this world (on
// e402286 the new Machines were bound to the old, terminating NodeClaims
// and the successors waited out a full launch wait with no providerID: the
// pods were pending about 2 minutes). Throughout, no Machine is bound to a
// NodeClaim that is terminating.
func TestReplicasTakenAwayRecoverFast(t *testing.T) {
	ctx := context.Background()
	const name = "taken"
	pool(t, name)
	md := machineDeployment(t, name, "taken-m5-large", "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	mds := []*clusterv1.MachineDeployment{md}
	if err := waitNodePoolReady(ctx, name); err != nil {
		t.Fatalf("NodePool %s not ready: %v", name, err)
	}
	watch := watchMachineDeployment(t, md, name)

	// A plain launch of 3 in this world, for comparison.
	start := time.Now()
	d := deployment(t, name, "app-taken", 3, "1500m") // one per m5.large
	got := waitCounts(t, 4*time.Minute, name, "app-taken", mds, func(c counts) bool {
		return c.RunningPods == 3 && c.Initialized == 3 && c.BoundMachines == 3 && c.Replicas == 3
	})
	plainPods := time.Since(start)
	plain := watch.launchTimes(start)
	plainMax := maxOf(plain)
	t.Logf("plain launch: 3 pods running after %s; NodeClaim creation to providerID %s: %s",
		plainPods.Round(100*time.Millisecond), describeDurations(plain), got)

	// The user takes two replicas away.
	logFrom := logSize(t, provider.LogPath)
	lowered := time.Now()
	scaleMachineDeployment(t, md, 1)
	got = waitCounts(t, 4*time.Minute, name, "app-taken", mds, func(c counts) bool {
		return c.RunningPods == 3 && c.PendingPods == 0 && c.NodeClaims == 3 && c.Initialized == 3 &&
			c.Machines == 3 && c.BoundMachines == 3 && c.Replicas == 3
	})
	recovered := time.Since(lowered)
	successors := watch.launchTimes(lowered)
	t.Logf("replicas lowered 3 -> 1: 3 pods running again after %s; successors' creation to providerID %s: %s",
		recovered.Round(100*time.Millisecond), describeDurations(successors), got)

	if len(successors) < 2 {
		t.Errorf("%d successor NodeClaims made after the lowering, want at least 2: %v", len(successors), successors)
	}
	// Within a plain launch's time: the slowest successor may take the
	// slowest plain launch plus the MachineSet's removal having run at the
	// same time, never anything near a launch wait.
	limit := plainMax + 15*time.Second
	for claim, took := range successors {
		if took == 0 || took > limit {
			t.Errorf("successor NodeClaim %s got its providerID after %s, want within %s (slowest plain launch %s; launch wait %s)",
				claim, took, limit, plainMax.Round(100*time.Millisecond), machinedeployment.DefaultLaunchWait)
		}
	}
	if bad := watch.bad(); len(bad) > 0 {
		t.Errorf("Machines bound to terminating NodeClaims: %v", bad)
	}
	// Core's cluster state waits on a NodeClaim without a providerID: no
	// stall of 30 s or more (core then logs it) while the pool recovered.
	for _, l := range logLines(t, provider.LogPath, logFrom, logSyncStall) {
		if strings.Contains(l.Raw, `"NodePool":{"name":"`+name+`"}`) {
			t.Errorf("core's cluster state stalled while the pool recovered: %s", l.Raw)
			break
		}
	}

	scaleDeployment(t, d, 0)
	waitCounts(t, 4*time.Minute, name, "app-taken", mds, func(c counts) bool {
		return c.NodeClaims == 0 && c.Machines == 0 && c.Replicas == 0
	})
	if bad := watch.bad(); len(bad) > 0 {
		t.Errorf("Machines bound to terminating NodeClaims: %v", bad)
	}
}

func maxOf(m map[string]time.Duration) time.Duration {
	var out time.Duration
	for _, d := range m {
		out = max(out, d)
	}
	return out
}

// describeDurations lists durations, shortest first (0: not yet).
func describeDurations(m map[string]time.Duration) []string {
	var ds []time.Duration
	for _, d := range m {
		ds = append(ds, d)
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Round(100 * time.Millisecond).String()
	}
	return out
}
