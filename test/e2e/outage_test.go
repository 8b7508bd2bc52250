package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// hubOutage is how long the hub's API server stays down.
const hubOutage = 2 * time.Minute

// Outages (issue 6): the hub's API server dies (killed: no graceful
// shutdown) for 2 minutes while 10 Karpenter nodes run, and more pods
// arrive meanwhile. Nothing is deleted on either side: no NodeClaim, Node or
// Machine. Within 30 s of the hub's return the pending pods get nodes,
// without anyone restarting the provider.
func TestHubOutageDeletesNothingAndRecovers(t *testing.T) {
	ctx := context.Background()
	pool(t, "outage")
	md := machineDeployment(t, "outage", "outage-m5-large", "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	mds := []*clusterv1.MachineDeployment{md}
	d := deployment(t, "outage", "app-outage", 10, "1500m") // one per m5.large

	start := time.Now()
	got := waitCounts(t, 6*time.Minute, "outage", "app-outage", mds, func(c counts) bool {
		return c.RunningPods == 10 && c.Initialized == 10 && c.Nodes == 10 && c.BoundMachines == 10
	})
	t.Logf("10 pods running on 10 nodes after %s: %s", time.Since(start).Round(time.Second), got)

	// What exists before the outage, by UID.
	machines := &clusterv1.MachineList{}
	if err := w.Hub.Client.List(ctx, machines, client.InNamespace(w.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
		t.Fatal(err)
	}
	machineUIDs := map[string]types.UID{}
	for _, m := range machines.Items {
		machineUIDs[m.Name] = m.UID
	}
	deletions := watchSpokeDeletions(t, "outage")

	down, startHub := stopHub(t)
	t.Logf("hub API server killed")
	// Three more pods, pending until the hub is back.
	scaleDeployment(t, d, 13)

	// The outage lasts hubOutage; meanwhile nothing may be deleted and the
	// provider must keep running.
	tick := time.NewTicker(5 * time.Second)
	for time.Since(down) < hubOutage {
		select {
		case <-tick.C:
		case <-time.After(hubOutage - time.Since(down)):
		}
		if provider.Exited() {
			t.Fatalf("the provider exited during the hub outage (log %s)", provider.LogPath)
		}
		if del := deletions.snapshot(); len(del) > 0 {
			t.Fatalf("deleted during the hub outage (%s in): %v", time.Since(down).Round(time.Second), del)
		}
	}
	tick.Stop()
	c, err := spokeCounts(ctx, "outage", "app-outage")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after %s without hub: %s", time.Since(down).Round(time.Second), c)
	if c.PendingPods != 3 || c.RunningPods != 10 || c.Nodes != 10 {
		t.Fatalf("during the outage want 10 pods running on 10 nodes and 3 pending, got %s", c)
	}

	restartStart := time.Now()
	startHub(ctx)
	back := time.Now()
	t.Logf("hub API server back after %s down (restart took %s)", back.Sub(down).Round(time.Second), back.Sub(restartStart).Round(time.Millisecond))

	got = waitCounts(t, 3*time.Minute, "outage", "app-outage", mds, func(c counts) bool {
		return c.RunningPods == 13 && c.PendingPods == 0
	})
	recovery := time.Since(back)
	t.Logf("the 3 pending pods run %s after the hub's return: %s", recovery.Round(100*time.Millisecond), got)
	if del := deletions.snapshot(); len(del) > 0 {
		t.Errorf("deleted during the hub outage or the recovery: %v", del)
	}
	deletions.stop()
	if recovery > 30*time.Second {
		t.Errorf("pending pods got nodes %s after the hub's return, want within 30s", recovery.Round(100*time.Millisecond))
	}

	// Every Machine of before is still there, the same object.
	for name, uid := range machineUIDs {
		m := &clusterv1.Machine{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: w.Namespace, Name: name}, m); err != nil {
			t.Errorf("Machine %s of before the outage: %v", name, err)
			continue
		}
		if m.UID != uid || !m.DeletionTimestamp.IsZero() {
			t.Errorf("Machine %s was replaced or is being deleted: uid %s (was %s), deletionTimestamp %v", name, m.UID, uid, m.DeletionTimestamp)
		}
	}
	final := waitCounts(t, time.Minute, "outage", "app-outage", mds, func(c counts) bool {
		return c.Nodes == 13 && c.NodeClaims == 13 && c.BoundMachines == 13
	})
	if final.Machines != 13 || final.Replicas != 13 || final.UnboundMachines != 0 {
		t.Fatalf("after the recovery want exactly 13 Machines (all bound), replicas 13, got %s", final)
	}

	scaleDeployment(t, d, 0)
	waitCounts(t, 6*time.Minute, "outage", "app-outage", mds, func(c counts) bool {
		return c.NodeClaims == 0 && c.Nodes == 0 && c.Machines == 0 && c.Replicas == 0
	})
}

// spokeCounts is count without the hub (which may be down).
func spokeCounts(ctx context.Context, pool, app string) (counts, error) {
	return count(ctx, pool, app)
}

// spokeDeletions records every NodeClaim and Node of a NodePool in the spoke
// that is deleted or starts being deleted.
type spokeDeletions struct {
	cancel context.CancelFunc
	mu     sync.Mutex
	seen   []string
}

func watchSpokeDeletions(t *testing.T, pool string) *spokeDeletions {
	t.Helper()
	_, spoke := worldCaches(t)
	sd := &spokeDeletions{}
	record := func(kind string) toolscache.ResourceEventHandlerFuncs {
		note := func(o any, what string) {
			if tomb, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o = tomb.Obj
			}
			obj, ok := o.(client.Object)
			if !ok || obj.GetLabels()[karpv1.NodePoolLabelKey] != pool {
				return
			}
			sd.mu.Lock()
			sd.seen = append(sd.seen, fmt.Sprintf("%s %s %s at %s", kind, obj.GetName(), what, time.Now().Format(time.TimeOnly)))
			sd.mu.Unlock()
		}
		return toolscache.ResourceEventHandlerFuncs{
			UpdateFunc: func(oldObj, newObj any) {
				o, n := oldObj.(client.Object), newObj.(client.Object)
				if o.GetDeletionTimestamp().IsZero() && !n.GetDeletionTimestamp().IsZero() {
					note(n, "marked for deletion")
				}
			},
			DeleteFunc: func(o any) { note(o, "deleted") },
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	sd.cancel = cancel
	for kind, o := range map[string]client.Object{"NodeClaim": &karpv1.NodeClaim{}, "Node": &corev1.Node{}} {
		inf, err := spoke.GetInformer(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := inf.AddEventHandler(record(kind)); err != nil {
			t.Fatal(err)
		}
	}
	go func() { _ = spoke.Start(ctx) }()
	if !spoke.WaitForCacheSync(ctx) {
		t.Fatal("spoke watch did not sync")
	}
	t.Cleanup(cancel)
	return sd
}

func (sd *spokeDeletions) snapshot() []string {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	return append([]string(nil), sd.seen...)
}

func (sd *spokeDeletions) stop() { sd.cancel() }

// stopHub stops the hub's API server and returns when it stopped and a
// function that starts it again (once; the test's cleanup starts it when the
// test ends before that).
func stopHub(t *testing.T) (time.Time, func(context.Context)) {
	t.Helper()
	if err := w.StopHubAPIServer(); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			if err := w.StartHubAPIServer(context.Background()); err != nil {
				t.Errorf("restarting the hub API server: %v", err)
			}
		}
	})
	return down, func(ctx context.Context) {
		t.Helper()
		if err := w.StartHubAPIServer(ctx); err != nil {
			t.Fatal(err)
		}
		restarted = true
	}
}
