package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/awslabs/operatorpkg/status"
	corev1 "k8s.io/api/core/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// a + b: ten pods that each need a node get ten Machines, Nodes and
// NodeClaims; scaling the workload to zero removes them all again.
func TestScaleUpAndDownThroughAMachineDeployment(t *testing.T) {
	pool(t, "a")
	md := machineDeployment(t, "a", "a-m5-large", "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	mds := []*clusterv1.MachineDeployment{md}
	d := deployment(t, "a", "app-a", 10, "1500m") // one per m5.large (2 vCPU)

	start := time.Now()
	got := waitCounts(t, 6*time.Minute, "a", "app-a", mds, func(c counts) bool {
		return c.RunningPods == 10 && c.Initialized == 10 && c.Nodes == 10 && c.BoundMachines == 10
	})
	t.Logf("10 pods running on 10 nodes after %s: %s", time.Since(start).Round(time.Second), got)
	if got.NodeClaims != 10 || got.Machines != 10 || got.Replicas != 10 || got.UnboundMachines != 0 {
		t.Fatalf("want exactly 10 NodeClaims, 10 Machines (all bound) and replicas 10, got %s", got)
	}
	if got.InstanceTypes["m5.large"] != 10 || got.Zones["us-east-1a"] != 10 {
		t.Fatalf("NodeClaims must carry the instance type and zone of the MachineDeployment, got %v %v", got.InstanceTypes, got.Zones)
	}

	waitEvents(t, "Bound", md.Name, 10)
	oneEventNamesTheMachine(t, "a")
	nodeClaimsAgreeWithClusterAPIOnTheirNodes(t, "a")

	scaleDeployment(t, d, 0)
	start = time.Now()
	got = waitCounts(t, 6*time.Minute, "a", "app-a", mds, func(c counts) bool {
		return c.NodeClaims == 0 && c.Nodes == 0 && c.Machines == 0 && c.Replicas == 0
	})
	t.Logf("scaled to zero after %s: %s", time.Since(start).Round(time.Second), got)
	if got.Pending != 0 {
		t.Fatalf("bookkeeping left on the MachineDeployment: %s", got)
	}
	waitEvents(t, "Released", md.Name, 10)
}

// oneEventNamesTheMachine checks that each of the pool's NodeClaims has one
// event of the provider's naming its Machine (MachineBound, at the bind) and
// not a second one at the launch (the provider's Launched, whose message
// starts with "Machine "; core's own Launched says the condition changed).
func oneEventNamesTheMachine(t *testing.T, pool string) {
	t.Helper()
	claims := nodeClaimNames(t, pool)
	var bound, launched map[string]int
	err := WaitFor(context.Background(), time.Minute, func(ctx context.Context) (bool, error) {
		events := &corev1.EventList{}
		if err := w.Spoke.Client.List(ctx, events); err != nil {
			return false, err
		}
		bound, launched = map[string]int{}, map[string]int{}
		for _, e := range events.Items {
			if e.InvolvedObject.Kind != "NodeClaim" || !slices.Contains(claims, e.InvolvedObject.Name) {
				continue
			}
			switch {
			case e.Reason == "MachineBound":
				bound[e.InvolvedObject.Name]++
			case e.Reason == "Launched" && strings.HasPrefix(e.Message, "Machine "):
				launched[e.InvolvedObject.Name]++
			}
		}
		return len(bound) == len(claims), nil
	})
	if err != nil {
		t.Fatalf("want a MachineBound event on each of NodeClaims %v, saw %v: %v", claims, bound, err)
	}
	if len(launched) != 0 {
		t.Errorf("the provider's Launched event names the Machine a second time on NodeClaims %v (MachineBound did): one event write per launch too many", launched)
	}
}

// nodeClaimsAgreeWithClusterAPIOnTheirNodes checks that the Machine a
// NodeClaim names is recorded as Cluster API records it on the Node: core
// copies a NodeClaim's annotations onto its Node, where Cluster API writes
// cluster.x-k8s.io/machine (the Machine's name) and
// cluster.x-k8s.io/cluster-namespace. A NodeClaim with <namespace>/<name>
// there had core overwrite Cluster API's value on every new Node, and
// Cluster API write it back (two writes, and conflicts, per node).
func nodeClaimsAgreeWithClusterAPIOnTheirNodes(t *testing.T, pool string) {
	t.Helper()
	var diff []string
	err := WaitFor(context.Background(), time.Minute, func(ctx context.Context) (bool, error) {
		ncs := &karpv1.NodeClaimList{}
		if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
			return false, err
		}
		diff = nil
		for _, nc := range ncs.Items {
			node := &corev1.Node{}
			if nc.Status.NodeName == "" {
				diff = append(diff, nc.Name+": no Node yet")
				continue
			}
			if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: nc.Status.NodeName}, node); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			for _, k := range []string{clusterv1.MachineAnnotation, clusterv1.ClusterNamespaceAnnotation} {
				if node.Annotations[k] == "" || nc.Annotations[k] != node.Annotations[k] {
					diff = append(diff, fmt.Sprintf("%s %s: NodeClaim %q, Node %q", nc.Name, k, nc.Annotations[k], node.Annotations[k]))
				}
			}
		}
		return len(ncs.Items) > 0 && len(diff) == 0, nil
	})
	if err != nil {
		t.Fatalf("NodeClaims of pool %s and Cluster API disagree on their Nodes: %v (%v)", pool, diff, err)
	}
}

func nodeClaimNames(t *testing.T, pool string) []string {
	t.Helper()
	ncs := &karpv1.NodeClaimList{}
	if err := w.Spoke.Client.List(context.Background(), ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, nc := range ncs.Items {
		names = append(names, nc.Name)
	}
	slices.Sort(names)
	return names
}

// waitEvents waits until the hub holds at least n events with the reason on
// Machines of the MachineDeployment (users see binds and releases there).
func waitEvents(t *testing.T, reason, mdName string, n int) {
	t.Helper()
	var seen map[string]bool
	err := WaitFor(context.Background(), time.Minute, func(ctx context.Context) (bool, error) {
		events := &corev1.EventList{}
		if err := w.Hub.Client.List(ctx, events, client.InNamespace(w.Namespace)); err != nil {
			return false, err
		}
		seen = map[string]bool{}
		for _, e := range events.Items {
			if e.Reason == reason && e.InvolvedObject.Kind == "Machine" && strings.HasPrefix(e.InvolvedObject.Name, mdName+"-") {
				seen[e.InvolvedObject.Name] = true
			}
		}
		return len(seen) >= n, nil
	})
	if err != nil {
		t.Fatalf("want %s events on %d Machines of %s, saw %d: %v", reason, n, mdName, len(seen), err)
	}
}

// c: of two MachineDeployments that both fit, the cheaper one is used; a pod
// only the bigger one fits goes there.
func TestCheapestFittingMachineDeploymentIsUsed(t *testing.T) {
	pool(t, "c")
	small := machineDeployment(t, "c", "c-m5-large", "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	big := machineDeployment(t, "c", "c-m5-xlarge", "m5.xlarge", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.192"})
	mds := []*clusterv1.MachineDeployment{small, big}

	deployment(t, "c", "app-c-small", 1, "1")
	got := waitCounts(t, 4*time.Minute, "c", "app-c-small", mds, func(c counts) bool { return c.RunningPods == 1 })
	if got.MachineDeploymentReplicas["c-m5-large"] != 1 || got.MachineDeploymentReplicas["c-m5-xlarge"] != 0 {
		t.Fatalf("a 1-CPU pod fits both: want the cheaper m5.large, got replicas %v", got.MachineDeploymentReplicas)
	}

	deployment(t, "c", "app-c-big", 1, "3")
	got = waitCounts(t, 4*time.Minute, "c", "app-c-big", mds, func(c counts) bool { return c.RunningPods == 1 })
	if got.MachineDeploymentReplicas["c-m5-xlarge"] != 1 {
		t.Fatalf("a 3-CPU pod fits only m5.xlarge, got replicas %v", got.MachineDeploymentReplicas)
	}
}

// e: a MachineDeployment with malformed annotations is skipped, named with
// the key on the NodeClass; the other keeps serving; nothing panics.
func TestMalformedAnnotationSkipsOnlyThatMachineDeployment(t *testing.T) {
	pool(t, "e")
	bad := machineDeployment(t, "e", "e-bad", "m5.large", "us-east-1a", map[string]string{
		"capacity.cluster-autoscaler.kubernetes.io/cpu":    "lots",
		"capacity.cluster-autoscaler.kubernetes.io/taints": "x",
		v1alpha1.PriceAnnotation:                           "0.01", // cheapest: would win if it were used
	})
	good := machineDeployment(t, "e", "e-good", "m5.large", "us-east-1b", map[string]string{v1alpha1.PriceAnnotation: "0.096"})

	var msg string
	err := WaitFor(context.Background(), time.Minute, func(ctx context.Context) (bool, error) {
		nc := &v1alpha1.ClusterAPINodeClass{}
		if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: "e"}, nc); err != nil {
			return false, err
		}
		cond := nc.StatusConditions().Get(v1alpha1.ConditionTypeInstanceTypesResolved)
		if cond == nil {
			return false, nil
		}
		msg = cond.Message
		return nc.StatusConditions().Get(status.ConditionReady).IsTrue() && strings.Contains(msg, "e-bad"), nil
	})
	if err != nil {
		t.Fatalf("NodeClass e must be Ready and name the bad MachineDeployment: %v; message: %q", err, msg)
	}
	for _, want := range []string{"capacity.cluster-autoscaler.kubernetes.io/cpu", `"lots"`, "capacity.cluster-autoscaler.kubernetes.io/taints"} {
		if !strings.Contains(msg, want) {
			t.Errorf("condition message does not name %s: %q", want, msg)
		}
	}

	deployment(t, "e", "app-e", 2, "1500m")
	got := waitCounts(t, 4*time.Minute, "e", "app-e", []*clusterv1.MachineDeployment{bad, good}, func(c counts) bool { return c.RunningPods == 2 })
	if got.MachineDeploymentReplicas["e-bad"] != 0 || got.MachineDeploymentReplicas["e-good"] != 2 {
		t.Fatalf("only the good MachineDeployment may be used, got %v", got.MachineDeploymentReplicas)
	}
	if provider.Exited() {
		t.Fatal("the provider exited")
	}
}

// d: the provider is killed right after raising replicas and started again:
// the same counts in the end, no extra replica, no unbound Machine.
func TestRestartAfterRaisingReplicasResumes(t *testing.T) {
	pool(t, "d")
	w.AWS.SetProvisionDelay(5 * time.Second) // the kill lands before any providerID
	t.Cleanup(func() { w.AWS.SetProvisionDelay(time.Second) })
	md := machineDeployment(t, "d", "d-m5-large", "m5.large", "us-east-1c", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	mds := []*clusterv1.MachineDeployment{md}
	deployment(t, "d", "app-d", 3, "1500m")

	waitCounts(t, 2*time.Minute, "d", "app-d", mds, func(c counts) bool { return c.Replicas >= 1 })
	provider.Kill()
	before := nodeClaimNames(t, "d")
	c, err := count(context.Background(), "d", "app-d", mds...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("killed the provider at: %s", c)
	provider, err = StartProvider(bin, w, "provider.log")
	if err != nil {
		t.Fatal(err)
	}

	got := waitCounts(t, 5*time.Minute, "d", "app-d", mds, func(c counts) bool {
		return c.RunningPods == 3 && c.Initialized == 3 && c.Pending == 0
	})
	if got.Replicas != 3 || got.Machines != 3 || got.BoundMachines != 3 || got.NodeClaims != 3 || got.Nodes != 3 {
		t.Fatalf("after the restart want exactly 3 replicas, Machines (all bound), NodeClaims and Nodes, got %s", got)
	}
	// The NodeClaims that were launching survive the restart: a provider that
	// starts cold must not report them as unlaunchable (Karpenter would delete them).
	if after := nodeClaimNames(t, "d"); len(before) == 0 || !slices.Equal(before, after) {
		t.Fatalf("NodeClaims before the restart %v, after %v: the launching ones must be the ones that launched", before, after)
	}
	// Nothing extra shows up later either.
	again := waitCounts(t, time.Minute, "d", "app-d", mds, func(c counts) bool { return c.RunningPods == 3 })
	if again.Machines != 3 || again.Replicas != 3 {
		t.Fatalf("counts changed: %s", again)
	}
}
