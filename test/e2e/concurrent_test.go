package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
)

// scaleBy changes a MachineDeployment's replicas by delta the way a careful
// concurrent writer does (read, change, update with the resourceVersion
// read, again on conflict), and returns how many conflicts it met. While
// Karpenter launches a burst it writes the MachineDeployment several times a
// second, so the writer backs off as client-go's DefaultBackoff does, but
// longer: five tries 10 ms apart gave up on a loaded machine (CI, load 8).
func scaleBy(ctx context.Context, md *clusterv1.MachineDeployment, delta int32) (int, error) {
	conflicts := -1
	backoff := wait.Backoff{Steps: 12, Duration: 20 * time.Millisecond, Factor: 1.6, Jitter: 0.2, Cap: 2 * time.Second}
	err := retry.RetryOnConflict(backoff, func() error {
		conflicts++
		cur := &clusterv1.MachineDeployment{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
			return err
		}
		r := max(*cur.Spec.Replicas+delta, 0)
		cur.Spec.Replicas = &r
		return w.Hub.Client.Update(ctx, cur)
	})
	return conflicts, err
}

// Someone else raises and lowers the replicas of a member MachineDeployment
// while Karpenter launches a burst on it: no change is lost or overwritten.
// In the end the replicas are Karpenter's bound Machines plus the writer's
// net change, the writer's Machines stay unbound and are left alone, and
// Karpenter's own count (owned-replicas) is exactly its NodeClaims. That
// holds too when the writer's scale-down takes a Karpenter Machine, and
// when someone deletes one (as a MachineHealthCheck does).
func TestConcurrentWriterKeepsItsReplicaChanges(t *testing.T) {
	const n = 12
	ctx := context.Background()
	pool(t, "conc")
	md := machineDeployment(t, "conc", "conc-m5-large", "m5.large", "us-east-1b", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	mds := []*clusterv1.MachineDeployment{md}

	start := time.Now()
	d := deployment(t, "conc", "app-conc", n, "1500m")
	// The writer: +2 +1 -1 +2 -1 -1 while the burst launches (net +2).
	deltas := []int32{2, 1, -1, 2, -1, -1}
	var net int32
	var conflicts int
	var wg sync.WaitGroup
	var writerErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, delta := range deltas {
			time.Sleep(1500 * time.Millisecond) // spread over the burst
			c, err := scaleBy(ctx, md, delta)
			if err != nil {
				writerErr = err
				return
			}
			conflicts += c
			net += delta
		}
	}()
	waitCounts(t, 6*time.Minute, "conc", "app-conc", mds, func(c counts) bool {
		return c.RunningPods == n && c.Initialized == n
	})
	wg.Wait()
	if writerErr != nil {
		t.Fatalf("the writer failed: %v", writerErr)
	}
	t.Logf("burst of %d done after %s; the writer changed replicas by %v (net %+d) and met %d conflicts", n, time.Since(start).Round(time.Second), deltas, net, conflicts)

	// Machines Karpenter lost to the writer's scale-downs (Cluster API
	// deletes unprovisioned Machines first) are settled after OrphanGrace.
	got := waitCounts(t, 3*time.Minute, "conc", "app-conc", mds, func(c counts) bool {
		return c.Pending == 0 && c.NodeClaims == n && c.BoundMachines == n && c.Replicas == int32(n)+net &&
			c.Machines == n+int(net) && c.UnboundMachines == int(net)
	})
	t.Logf("settled after %s: %s", time.Since(start).Round(time.Second), got)
	cur := &clusterv1.MachineDeployment{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
		t.Fatal(err)
	}
	if v := cur.Annotations[machinedeployment.OwnedReplicasAnnotation]; v != "12" {
		t.Fatalf("owned replicas %q, want %d (one per NodeClaim)", v, n)
	}
	// The writer's Machines are neither bound nor removed later.
	holdCounts(t, machinedeployment.OrphanGrace+5*time.Second, "conc", "app-conc", mds, func(c counts) bool {
		return c.Replicas == int32(n)+net && c.Machines == n+int(net) && c.UnboundMachines == int(net) && c.BoundMachines == n
	})

	// The writer scales down by one and picks a Karpenter node for it
	// (delete-machine): Cluster API removes that node and Karpenter's
	// NodeClaim reclaims the lost replica (a reservation stamped at the lost
	// Machine's creation). A Machine of the writer's made since then takes
	// its place and the writer's net change holds; a writer's Machine made
	// before is never taken (the stamp rule), so when there is none the
	// replica goes back to the writer's share and Karpenter raises for its
	// replacement. Which case a run meets depends on the order the burst's
	// Machines were made in: the victim is the oldest bound Machine, and the
	// test asserts the outcome of the case it meets.
	victim, replaceable := oldestBoundMachine(t, md)
	if !replaceable {
		net++ // the writer's lowering is undone: Karpenter raises for its replacement
	}
	t.Logf("victim %s made %s; a writer's Machine made since: %v", victim.Name, victim.CreationTimestamp.UTC().Format(time.RFC3339), replaceable)
	mark := client.MergeFrom(victim.DeepCopy())
	victim.Annotations[clusterv1.DeleteMachineAnnotation] = "writer"
	if err := w.Hub.Client.Patch(ctx, victim, mark); err != nil {
		t.Fatal(err)
	}
	if _, err := scaleBy(ctx, md, -1); err != nil {
		t.Fatal(err)
	}
	net--
	start = time.Now()
	got = waitCounts(t, 4*time.Minute, "conc", "app-conc", mds, func(c counts) bool {
		return c.RunningPods == n && c.Pending == 0 && c.NodeClaims == n && c.BoundMachines == n && c.Replicas == int32(n)+net &&
			c.Machines == n+int(net) && c.UnboundMachines == int(net) && !machineExists(t, victim)
	})
	t.Logf("the writer took Karpenter's Machine %s (net now %+d); settled after %s: %s", victim.Name, net, time.Since(start).Round(time.Second), got)

	// Someone deletes a Karpenter Machine (as a MachineHealthCheck
	// remediates): the MachineSet replaces it, and the replacement ends up
	// bound to Karpenter's replacement NodeClaim or given back.
	victim = boundMachine(t, md)
	if err := w.Hub.Client.Delete(ctx, victim); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	got = waitCounts(t, 4*time.Minute, "conc", "app-conc", mds, func(c counts) bool {
		return c.RunningPods == n && c.Pending == 0 && c.NodeClaims == n && c.BoundMachines == n && c.Replicas == int32(n)+net &&
			c.Machines == n+int(net) && c.UnboundMachines == int(net) && !machineExists(t, victim)
	})
	t.Logf("Machine %s deleted by someone else; settled after %s: %s; %d ReplicasChanged events in all", victim.Name, time.Since(start).Round(time.Second), got, mdEvents(t, md, "ReplicasChanged"))
	if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
		t.Fatal(err)
	}
	if v := cur.Annotations[machinedeployment.OwnedReplicasAnnotation]; v != "12" {
		t.Fatalf("owned replicas %q, want %d (one per NodeClaim)", v, n)
	}

	// Karpenter scales down to nothing; the writer's replicas stay.
	scaleDeployment(t, d, 0)
	waitCounts(t, 5*time.Minute, "conc", "app-conc", mds, func(c counts) bool {
		return c.NodeClaims == 0 && c.BoundMachines == 0 && c.Replicas == net && c.Machines == int(net)
	})
	if _, err := scaleBy(ctx, md, -net); err != nil {
		t.Fatal(err)
	}
	waitCounts(t, 2*time.Minute, "conc", "app-conc", mds, func(c counts) bool { return c.Machines == 0 && c.Replicas == 0 })
}

// oldestBoundMachine returns the live Machine of the MachineDeployment bound
// to a NodeClaim that was made first, and whether a live unbound Machine was
// made in the same second or later (one a reservation stamped at its
// creation may be bound to).
func oldestBoundMachine(t *testing.T, md *clusterv1.MachineDeployment) (*clusterv1.Machine, bool) {
	t.Helper()
	ms := &clusterv1.MachineList{}
	if err := w.Hub.Client.List(context.Background(), ms, client.InNamespace(md.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
		t.Fatal(err)
	}
	var oldest *clusterv1.Machine
	var newestUnbound time.Time
	for i := range ms.Items {
		m := &ms.Items[i]
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		if m.Annotations[v1alpha1.NodeClaimAnnotation] == "" {
			if m.CreationTimestamp.After(newestUnbound) {
				newestUnbound = m.CreationTimestamp.Time
			}
			continue
		}
		if oldest == nil || m.CreationTimestamp.Before(&oldest.CreationTimestamp) {
			oldest = m
		}
	}
	if oldest == nil {
		t.Fatalf("no bound Machine in MachineDeployment %s", md.Name)
	}
	return oldest, !newestUnbound.Before(oldest.CreationTimestamp.Time)
}

// boundMachine returns a live Machine of the MachineDeployment bound to a
// NodeClaim.
func boundMachine(t *testing.T, md *clusterv1.MachineDeployment) *clusterv1.Machine {
	t.Helper()
	ms := &clusterv1.MachineList{}
	if err := w.Hub.Client.List(context.Background(), ms, client.InNamespace(md.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
		t.Fatal(err)
	}
	for i := range ms.Items {
		if m := &ms.Items[i]; m.DeletionTimestamp.IsZero() && m.Annotations[v1alpha1.NodeClaimAnnotation] != "" {
			return m
		}
	}
	t.Fatalf("no bound Machine in MachineDeployment %s", md.Name)
	return nil
}

func machineExists(t *testing.T, m *clusterv1.Machine) bool {
	t.Helper()
	err := w.Hub.Client.Get(context.Background(), client.ObjectKeyFromObject(m), &clusterv1.Machine{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}
