package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
)

// Karpenter core deletes a NodeClaim whose launch outlasts its launch
// timeout (5 minutes): with hundreds raised on one MachineDeployment, its
// MachineSet may not have made the NodeClaim's Machine yet (docs/
// performance.md, "1 000 nodes"). Here the MachineSet is held back by
// pausing the MachineDeployment (Cluster API's paused annotation: its
// replicas do not reach the MachineSet), and the NodeClaim is deleted as the
// launch timeout deletes it. Its reservation is free, not given back: the
// next NodeClaim core makes for the pod takes it (spec.replicas stays 1 from
// the raise on, never 0 or 2; one ReservationsChanged event says so), and
// once the MachineSet goes on, the one Machine it makes is bound to that
// NodeClaim and the pod runs. (Before issue 35 the replica was "held" in an
// annotation of its own, with a ReplicaHeld event; docs/upgrade.md.)
func TestANodeClaimDeletedBeforeItsMachineLeavesItsReplicaToTheNext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool(t, "held")
	md := machineDeployment(t, "held", "held-m5-large", "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	key := client.ObjectKeyFromObject(md)

	// Every spec.replicas the MachineDeployment has, and every Machine made for it.
	hubCache, _ := worldCaches(t)
	var mu sync.Mutex
	var seen []int32
	mdInf, err := hubCache.GetInformer(ctx, &clusterv1.MachineDeployment{})
	if err != nil {
		t.Fatal(err)
	}
	record := func(o any) {
		if d, ok := o.(*clusterv1.MachineDeployment); ok && d.Name == md.Name && d.Spec.Replicas != nil {
			mu.Lock()
			if len(seen) == 0 || seen[len(seen)-1] != *d.Spec.Replicas {
				seen = append(seen, *d.Spec.Replicas)
			}
			mu.Unlock()
		}
	}
	if _, err := mdInf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: record, UpdateFunc: func(_, o any) { record(o) }}); err != nil {
		t.Fatal(err)
	}
	machinesMade := countMachinesMade(ctx, t, hubCache, md.Name)
	go func() { _ = hubCache.Start(ctx) }()
	hubCache.WaitForCacheSync(ctx)

	// Hold the MachineSet back once it exists.
	if err := WaitFor(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		sets := &clusterv1.MachineSetList{}
		err := w.Hub.Client.List(ctx, sets, client.InNamespace(md.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name})
		return err == nil && len(sets.Items) > 0, err
	}); err != nil {
		t.Fatalf("no MachineSet for %s: %v", key, err)
	}
	setPaused(t, key, true)
	unpaused := false
	t.Cleanup(func() {
		if !unpaused {
			setPaused(t, key, false)
		}
	})

	workload(t, "held", "held-app", 1, "1500m", "", nil)
	// The first NodeClaim's replica is raised. A reservation whose
	// NodeClaim is gone is free at once (a live read says NotFound): no age
	// is needed.
	var first string
	if err := WaitFor(ctx, 3*time.Minute, func(ctx context.Context) (bool, error) {
		_, pending, err := pendingOn(ctx, key)
		if err != nil {
			return false, err
		}
		for claim := range pending {
			first = claim
			return true, nil
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no reservation on %s: %v", key, err)
	}
	// As core's launch timeout does: the NodeClaim goes, no Delete call
	// (it has no providerID).
	if err := w.Spoke.Client.Delete(ctx, &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: first}}); client.IgnoreNotFound(err) != nil {
		t.Fatalf("deleting NodeClaim %s: %v", first, err)
	}
	t.Logf("NodeClaim %s deleted before its Machine existed", first)

	// Core makes the next NodeClaim for the pod once the first is gone; it
	// takes the free reservation. The first goes once its Create returns:
	// the launch waits for a providerID up to the launch wait (core's cluster
	// state is not synced meanwhile, so no other NodeClaim comes sooner).
	var next string
	if err := WaitFor(ctx, machinedeployment.DefaultLaunchWait+time.Minute, func(ctx context.Context) (bool, error) {
		_, pending, err := pendingOn(ctx, key)
		if err != nil {
			return false, err
		}
		_, stillFirst := pending[first]
		for claim := range pending {
			if claim != first {
				next = claim
			}
		}
		return next != "" && !stillFirst, nil
	}); err != nil {
		t.Fatalf("no next NodeClaim took the reservation of %s on %s: %v", first, key, err)
	}
	t.Logf("NodeClaim %s reserved on %s", next, key)

	setPaused(t, key, false)
	unpaused = true
	nodes := waitAppNodes(t, 3*time.Minute, "held-app", 1)
	// Cluster API copies the instance's providerID onto the Machine once it
	// is provisioned, which may be after the pod runs.
	var machines []clusterv1.Machine
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		list := &clusterv1.MachineList{}
		if err := w.Hub.Client.List(ctx, list, client.InNamespace(md.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
			return false, err
		}
		machines = list.Items
		return len(machines) == 1 && machines[0].Spec.ProviderID == nodes[0].Spec.ProviderID, nil
	}); err != nil {
		t.Fatalf("want one Machine of %s with the node's providerID %s, have %d: %v", key, nodes[0].Spec.ProviderID, len(machines), err)
	}

	mu.Lock()
	replicas := append([]int32(nil), seen...)
	mu.Unlock()
	made := machinesMade()
	t.Logf("spec.replicas went %v; %d Machines made", replicas, made)
	for i, r := range replicas {
		if i > 0 && r != 1 {
			t.Errorf("spec.replicas went %v: from the raise on it must stay 1 (held, not given back and raised again)", replicas)
			break
		}
	}
	if made != 1 || len(machines) != 1 {
		t.Errorf("%d Machines made (%d live), want 1", made, len(machines))
	}
	if got := machines[0].Annotations[v1alpha1.NodeClaimAnnotation]; got != next {
		t.Errorf("Machine %s is bound to %q, want the next NodeClaim %s", machines[0].Name, got, next)
	}
	msgs, err := mdEventMessages(ctx, md, "ReservationsChanged")
	if err != nil {
		t.Fatal(err)
	}
	taken := 0
	for msg, n := range msgs {
		if strings.Contains(msg, fmt.Sprintf("NodeClaim %s takes the reserved replica of NodeClaim %s", next, first)) {
			taken += n
		}
	}
	if taken != 1 {
		t.Errorf("%d ReservationsChanged events on %s saying NodeClaim %s took the replica of %s, want 1 (events: %v)", taken, key, next, first, msgs)
	}
	if nodes[0].Labels[corev1.LabelInstanceTypeStable] != "m5.large" {
		t.Errorf("the node is %s, want m5.large", nodes[0].Labels[corev1.LabelInstanceTypeStable])
	}
}

// pendingOn reads a MachineDeployment and its reservations.
func pendingOn(ctx context.Context, key client.ObjectKey) (*clusterv1.MachineDeployment, map[string]time.Time, error) {
	cur := &clusterv1.MachineDeployment{}
	if err := w.Hub.Client.Get(ctx, key, cur); err != nil {
		return nil, nil, err
	}
	pending, err := hub.PendingNodeClaims(cur)
	return cur, pending, err
}

// setPaused sets or removes Cluster API's paused annotation on a
// MachineDeployment.
func setPaused(t testing.TB, key client.ObjectKey, paused bool) {
	t.Helper()
	cur := &clusterv1.MachineDeployment{}
	if err := w.Hub.Client.Get(context.Background(), key, cur); err != nil {
		t.Fatal(err)
	}
	if err := patchPaused(context.Background(), cur, paused); err != nil {
		t.Fatal(fmt.Errorf("pausing MachineDeployment %s (%v): %w", key, paused, err))
	}
}

// patchPaused sets (or removes) Cluster API's paused annotation on a hub
// object with a merge patch of that annotation alone.
func patchPaused(ctx context.Context, o client.Object, paused bool) error {
	patch := client.MergeFrom(o.DeepCopyObject().(client.Object))
	a := o.GetAnnotations()
	if paused {
		if a == nil {
			a = map[string]string{}
		}
		a[clusterv1.PausedAnnotation] = "true"
	} else {
		delete(a, clusterv1.PausedAnnotation)
	}
	o.SetAnnotations(a)
	return w.Hub.Client.Patch(ctx, o, patch)
}
