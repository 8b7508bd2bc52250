package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// poolCapacity sorts the Ready nodes of a pool by capacity type, checking
// each against the simulated instance behind it, and says whether every pod
// of the apps runs.
func poolCapacity(ctx context.Context, pool, reservation string, apps ...string) (reserved, onDemand []string, err error) {
	for _, app := range apps {
		if _, err := nodesOfApp(ctx, app); err != nil {
			return nil, nil, err
		}
	}
	nodes := &corev1.NodeList{}
	if err := w.Spoke.Client.List(ctx, nodes, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
		return nil, nil, err
	}
	instances := map[string]world.Instance{}
	for _, in := range w.AWS.Instances() {
		instances[in.ProviderID] = in
	}
	for _, n := range nodes.Items {
		if !n.DeletionTimestamp.IsZero() {
			continue
		}
		in := instances[n.Spec.ProviderID]
		switch ct := n.Labels[karpv1.CapacityTypeLabelKey]; ct {
		case karpv1.CapacityTypeReserved:
			if n.Labels[v1alpha1.LabelCapacityReservationID] != reservation || in.ReservationID != reservation {
				return nil, nil, fmt.Errorf("node %s is labelled reserved in %q, its instance runs in reservation %q", n.Name, n.Labels[v1alpha1.LabelCapacityReservationID], in.ReservationID)
			}
			reserved = append(reserved, n.Name)
		case karpv1.CapacityTypeOnDemand:
			if in.ReservationID != "" || n.Labels[v1alpha1.LabelCapacityReservationID] != "" {
				return nil, nil, fmt.Errorf("on-demand node %s runs in reservation %q", n.Name, in.ReservationID)
			}
			onDemand = append(onDemand, n.Name)
		default:
			return nil, nil, fmt.Errorf("node %s has capacity type %q", n.Name, ct)
		}
	}
	slices.Sort(reserved)
	return reserved, onDemand, nil
}

// waitPool waits until every pod of the apps runs and the pool's nodes satisfy ok.
func waitPool(t *testing.T, timeout time.Duration, reservation string, apps []string, ok func(reserved, onDemand []string) bool) (reserved, onDemand []string) {
	t.Helper()
	var last error
	err := WaitFor(context.Background(), timeout, func(ctx context.Context) (bool, error) {
		r, od, err := poolCapacity(ctx, "rsv", reservation, apps...)
		if err != nil {
			last = err
			return false, nil
		}
		reserved, onDemand = r, od
		return ok(r, od), nil
	})
	if err != nil {
		t.Fatalf("pool rsv: reserved %v, on-demand %v (last: %v): %v", reserved, onDemand, last, err)
	}
	return reserved, onDemand
}

// deleteNodeAndWaitMachineGone deletes a node's NodeClaim and waits until its
// Machine is gone from the hub (its instance terminated).
func deleteNodeAndWaitMachineGone(t *testing.T, node string) {
	t.Helper()
	ctx := context.Background()
	nc := nodeClaimOfNode(t, node)
	if err := w.Spoke.Client.Delete(ctx, nc); err != nil {
		t.Fatal(err)
	}
	err := WaitFor(ctx, 3*time.Minute, func(ctx context.Context) (bool, error) {
		ms, err := poolMachines(ctx, "rsv")
		if err != nil {
			return false, err
		}
		for _, m := range ms {
			if m.Annotations[v1alpha1.NodeClaimAnnotation] == nc.Name {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the Machine of NodeClaim %s stayed: %v", nc.Name, err)
	}
}

// A capacity reservation of 2 m5.large behind an AWSMachineTemplate: the
// first two nodes go into it (near-free, preferred), the third falls back
// to on-demand without a failed launch; when a reserved node goes away its
// slot is used again. When the cloud's reservation is smaller than the
// annotation says, the failed launch falls back to on-demand too.
func TestReservedCapacityExhaustionAndFallback(t *testing.T) {
	const id = "cr-0e2e0000000000001"
	w.AWS.SetCapacityReservation(id, "m5.large", "us-east-1a", 2)
	t.Cleanup(func() { w.AWS.SetCapacityReservation(id, "m5.large", "us-east-1a", 0) })
	// Budget 0: no consolidation moves nodes while the test counts them.
	machinePool(t, "rsv", machinePoolOptions{CapacityTypes: []string{karpv1.CapacityTypeReserved, karpv1.CapacityTypeOnDemand}, Budget: "0"})
	tmpl := world.AWSMachineTemplate(w.Namespace, "rsv-m5-large", "m5.large", false)
	tmpl.Spec.Template.Spec.CapacityReservationID = ptr.To(id)
	memberTemplateObject(t, "rsv", tmpl, map[string]string{
		v1alpha1.PriceAnnotation:            "0.096",
		v1alpha1.ReservationCountAnnotation: "2",
		v1alpha1.ReservationZoneAnnotation:  "us-east-1a",
	})
	oneNodeEach := func(s *corev1.PodSpec) { s.NodeSelector[corev1.LabelTopologyZone] = "us-east-1a" }

	// Exhaustion: one pod per node (1500m of an m5.large's 2 CPUs).
	start := time.Now()
	workload(t, "rsv", "rsv-app", 3, "1500m", "", oneNodeEach)
	reserved, onDemand := waitPool(t, 4*time.Minute, id, []string{"rsv-app"}, func(r, od []string) bool { return len(r)+len(od) == 3 })
	t.Logf("3 nodes after %s: reserved %v, on-demand %v", time.Since(start).Round(time.Second), reserved, onDemand)
	if len(reserved) != 2 || len(onDemand) != 1 {
		t.Fatalf("want 2 reserved nodes and 1 on-demand, got reserved %v, on-demand %v", reserved, onDemand)
	}
	if n := hubEvents(t, "LaunchFailed", "ReservationCapacityExceeded"); n != 0 {
		t.Errorf("%d launches into the full reservation failed at the cloud: the provider must not try them", n)
	}
	// Reserved NodeClaims carry what the NodePool asked for: none drifts.
	claims := &karpv1.NodeClaimList{}
	if err := w.Spoke.Client.List(context.Background(), claims, client.MatchingLabels{karpv1.NodePoolLabelKey: "rsv"}); err != nil {
		t.Fatal(err)
	}
	for _, nc := range claims.Items {
		if c := nc.StatusConditions().Get(karpv1.ConditionTypeDrifted); c != nil && c.IsTrue() {
			t.Errorf("NodeClaim %s (%s) is drifted: %s", nc.Name, nc.Labels[karpv1.CapacityTypeLabelKey], c.Reason)
		}
	}

	// A reserved node goes away: its slot comes back and takes the next launch.
	deleteNodeAndWaitMachineGone(t, reserved[0])
	workload(t, "rsv", "rsv-more", 1, "1500m", "", oneNodeEach)
	before := reserved
	reserved, onDemand = waitPool(t, 4*time.Minute, id, []string{"rsv-app", "rsv-more"}, func(r, od []string) bool { return len(r)+len(od) == 4 })
	if len(reserved) != 2 || slices.Contains(reserved, before[0]) {
		t.Fatalf("after reserved node %s went away, want its slot used again (2 reserved nodes), got reserved %v, on-demand %v", before[0], reserved, onDemand)
	}

	// The cloud's reservation shrinks below what the annotation says: the
	// provider's next reserved launch fails at the cloud; the offering is
	// left out and the pods run on-demand.
	w.AWS.SetCapacityReservation(id, "m5.large", "us-east-1a", 1)
	deleteNodeAndWaitMachineGone(t, reserved[0])
	workload(t, "rsv", "rsv-last", 1, "1500m", "", oneNodeEach)
	reserved, onDemand = waitPool(t, 5*time.Minute, id, []string{"rsv-app", "rsv-more", "rsv-last"}, func(r, od []string) bool { return len(r)+len(od) == 5 })
	if len(reserved) != 1 {
		t.Fatalf("with the cloud's reservation at 1, want 1 reserved node, got reserved %v, on-demand %v", reserved, onDemand)
	}
	waitHubEvent(t, "LaunchFailed", "ReservationCapacityExceeded")
}

// memberTemplateObject creates a prepared AWSMachineTemplate as a member of the pool.
func memberTemplateObject(t testing.TB, pool string, tmpl *infrav1.AWSMachineTemplate, annotations map[string]string) {
	t.Helper()
	ctx := context.Background()
	tmpl.Labels = map[string]string{v1alpha1.KarpenterMemberLabel: "", "pool": pool, "cluster.x-k8s.io/cluster-name": w.ClusterName}
	tmpl.Annotations = annotations
	status := tmpl.Status
	if err := w.Hub.Client.Create(ctx, tmpl); err != nil {
		t.Fatalf("creating AWSMachineTemplate %s: %v", tmpl.Name, err)
	}
	tmpl.Status = status
	if err := w.Hub.Client.Status().Update(ctx, tmpl); err != nil {
		t.Fatalf("writing the status of AWSMachineTemplate %s: %v", tmpl.Name, err)
	}
	t.Cleanup(func() { _ = w.Hub.Client.Delete(context.Background(), tmpl) })
}

// nodeClaimOfNode returns the NodeClaim of a Node (core records the Node's
// name on its NodeClaim a moment after the Node registers).
func nodeClaimOfNode(t testing.TB, node string) *karpv1.NodeClaim {
	t.Helper()
	var found *karpv1.NodeClaim
	err := WaitFor(context.Background(), 30*time.Second, func(ctx context.Context) (bool, error) {
		list := &karpv1.NodeClaimList{}
		if err := w.Spoke.Client.List(ctx, list); err != nil {
			return false, err
		}
		for i := range list.Items {
			if list.Items[i].Status.NodeName == node {
				found = &list.Items[i]
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no NodeClaim of node %s: %v", node, err)
	}
	return found
}

// hubEvents counts the hub's events of a reason whose message contains text.
func hubEvents(t testing.TB, reason, text string) int {
	t.Helper()
	events := &corev1.EventList{}
	if err := w.Hub.Client.List(context.Background(), events, client.InNamespace(w.Namespace)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range events.Items {
		if e.Reason == reason && strings.Contains(e.Message, text) {
			n++
		}
	}
	return n
}

// MachineDeployment mode: a MachineDeployment whose AWSMachineTemplate names
// a reservation of 1 offers it as reserved; the second node falls back to an
// on-demand MachineDeployment of the same type; the reserved one is never
// raised past the reservation.
func TestReservedMachineDeploymentFallsBackToOnDemand(t *testing.T) {
	ctx := context.Background()
	const id = "cr-0e2e0000000000002"
	w.AWS.SetCapacityReservation(id, "m5.large", "us-east-1b", 1)
	t.Cleanup(func() { w.AWS.SetCapacityReservation(id, "m5.large", "us-east-1b", 0) })
	pool(t, "rsvmd")
	updateNodePool(t, "rsvmd", func(np *karpv1.NodePool) {
		for i, r := range np.Spec.Template.Spec.Requirements {
			if r.Key == karpv1.CapacityTypeLabelKey {
				np.Spec.Template.Spec.Requirements[i].Values = []string{karpv1.CapacityTypeReserved, karpv1.CapacityTypeOnDemand}
			}
		}
		np.Spec.Disruption.Budgets = []karpv1.Budget{{Nodes: "0"}}
	})
	tmpl := world.AWSMachineTemplate(w.Namespace, "rsvmd-reserved", "m5.large", false)
	tmpl.Spec.Template.Spec.CapacityReservationID = ptr.To(id)
	if err := w.Hub.Client.Create(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Hub.Client.Delete(context.Background(), tmpl) })
	reservedMD := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: w.Namespace, Name: "rsvmd-reserved", ClusterName: w.ClusterName, Member: true,
		Labels: map[string]string{"pool": "rsvmd"}, FailureDomain: "us-east-1b",
		Annotations: map[string]string{
			v1alpha1.PriceAnnotation: "0.096", v1alpha1.ReservationCountAnnotation: "1",
			"capacity.cluster-autoscaler.kubernetes.io/cpu": "2", "capacity.cluster-autoscaler.kubernetes.io/memory": "8Gi",
		},
	})
	if err := w.Hub.Client.Create(ctx, reservedMD); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Hub.Client.Delete(context.Background(), reservedMD) })
	onDemandMD := machineDeployment(t, "rsvmd", "rsvmd-od", "m5.large", "us-east-1b", map[string]string{
		v1alpha1.PriceAnnotation:                        "0.096",
		"capacity.cluster-autoscaler.kubernetes.io/cpu": "2", "capacity.cluster-autoscaler.kubernetes.io/memory": "8Gi",
	})

	workload(t, "rsvmd", "rsvmd-app", 2, "1500m", "", nil)
	nodes := waitAppNodes(t, 4*time.Minute, "rsvmd-app", 2)
	types := map[string]int{}
	for _, n := range nodes {
		ct := n.Labels[karpv1.CapacityTypeLabelKey]
		types[ct]++
		in := instanceOf(t, n)
		if (ct == karpv1.CapacityTypeReserved) != (in.ReservationID == id) || (ct == karpv1.CapacityTypeReserved && n.Labels[v1alpha1.LabelCapacityReservationID] != id) {
			t.Errorf("node %s: capacity type %s, reservation label %q, instance in reservation %q", n.Name, ct, n.Labels[v1alpha1.LabelCapacityReservationID], in.ReservationID)
		}
	}
	if types[karpv1.CapacityTypeReserved] != 1 || types[karpv1.CapacityTypeOnDemand] != 1 {
		t.Fatalf("want one reserved and one on-demand node, got %v", types)
	}
	for _, md := range []*clusterv1.MachineDeployment{reservedMD, onDemandMD} {
		cur := &clusterv1.MachineDeployment{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
			t.Fatal(err)
		}
		if cur.Spec.Replicas == nil || *cur.Spec.Replicas != 1 {
			t.Errorf("MachineDeployment %s has %v replicas, want 1", md.Name, cur.Spec.Replicas)
		}
	}
}

// updateNodePool changes a NodePool, retrying on conflicts (core writes
// its status and hash annotations right after it is created).
func updateNodePool(t testing.TB, name string, mutate func(*karpv1.NodePool)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		np := &karpv1.NodePool{}
		if err := w.Spoke.Client.Get(context.Background(), client.ObjectKey{Name: name}, np); err != nil {
			return err
		}
		mutate(np)
		return w.Spoke.Client.Update(context.Background(), np)
	})
	if err != nil {
		t.Fatalf("updating NodePool %s: %v", name, err)
	}
}
