package e2eha

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/autonode/karpenter-clusterapi/test/e2e"
	"github.com/autonode/karpenter-clusterapi/test/ha"
)

// replicas starts two provider replicas with leader election and waits for
// a leader; they are stopped at the end of the test (after the pools'
// cleanup, which needs them).
func replicas(t *testing.T) (*ha.ReplicaSet, int) {
	t.Helper()
	rs, err := ha.Start(bin, w, ha.Options{Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rs.Stop()
		if p := panicked(rs.Logs()); p != "" {
			t.Errorf("a provider replica panicked (\"Observed a panic\" in %s)", p)
		}
		if t.Failed() {
			t.Logf("replica logs: %v", rs.Logs())
		}
	})
	leader, _, err := rs.WaitLeader(context.Background(), 90*time.Second, -1)
	if err != nil {
		t.Fatal(err)
	}
	return rs, leader
}

// pool creates a pool and removes it at the end of the test, once its
// Machines are gone.
func pool(t *testing.T, name string, o ha.PoolOptions) {
	t.Helper()
	ctx := context.Background()
	hubObjs, spokeObjs, err := ha.Pool(ctx, w, name, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, obj := range spokeObjs {
			_ = w.Spoke.Client.Delete(ctx, obj)
		}
		err := e2e.WaitFor(ctx, 3*time.Minute, func(ctx context.Context) (bool, error) {
			c, err := ha.Count(ctx, w, name, "")
			return err == nil && c.Machines == 0 && c.NodeClaims == 0, err
		})
		if err != nil {
			t.Errorf("pool %s: Machines or NodeClaims left after deleting its NodePool: %v", name, err)
		}
		for _, obj := range hubObjs {
			_ = w.Hub.Client.Delete(ctx, obj)
		}
	})
}

// app creates a Deployment of pods of the pool, one per m5.large node, and
// deletes it at the end of the test.
func app(t *testing.T, pool, name string, replicas int32) *appsv1.Deployment {
	t.Helper()
	d, err := ha.Deployment(context.Background(), w, pool, name, replicas, "1500m")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Spoke.Client.Delete(context.Background(), d) })
	return d
}

func scale(t *testing.T, d *appsv1.Deployment, replicas int32) {
	t.Helper()
	if err := ha.Scale(context.Background(), w, d, replicas); err != nil {
		t.Fatal(err)
	}
}

// waitCounts waits until want holds for the pool's counts.
func waitCounts(t *testing.T, timeout time.Duration, pool, app string, want func(ha.Counts) bool) ha.Counts {
	t.Helper()
	var last ha.Counts
	err := e2e.WaitFor(context.Background(), timeout, func(ctx context.Context) (bool, error) {
		c, err := ha.Count(ctx, w, pool, app)
		if err != nil {
			return false, err
		}
		last = c
		return want(c), nil
	})
	if err != nil {
		t.Fatalf("pool %s: %v; last: %s", pool, err, last)
	}
	return last
}

func waitUntil(ctx context.Context, timeout time.Duration, cond func(context.Context) (bool, error)) error {
	return e2e.WaitFor(ctx, timeout, cond)
}
