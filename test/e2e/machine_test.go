package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// workload creates a Deployment of the pool whose pods request cpu and
// memory; mutate adjusts the pod spec.
func workload(t testing.TB, pool, name string, replicas int32, cpu, memory string, mutate func(*corev1.PodSpec)) *appsv1.Deployment {
	t.Helper()
	requests := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}
	if memory != "" {
		requests[corev1.ResourceMemory] = resource.MustParse(memory)
	}
	return podDeployment(t, pool, name, replicas, requests, mutate)
}

// nodesOfApp returns the Nodes the running pods of an app are on.
func nodesOfApp(ctx context.Context, app string) ([]corev1.Node, error) {
	pods := &corev1.PodList{}
	if err := w.Spoke.Client.List(ctx, pods, client.MatchingLabels{"app": app}); err != nil {
		return nil, err
	}
	var out []corev1.Node
	for _, p := range pods.Items {
		if p.Spec.NodeName == "" || p.Status.Phase != corev1.PodRunning || !p.DeletionTimestamp.IsZero() {
			return nil, fmt.Errorf("pod %s is not running yet", p.Name)
		}
		n := &corev1.Node{}
		if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: p.Spec.NodeName}, n); err != nil {
			return nil, err
		}
		out = append(out, *n)
	}
	return out, nil
}

// waitAppNodes waits until n pods of the app run and returns their Nodes.
func waitAppNodes(t testing.TB, timeout time.Duration, app string, n int) []corev1.Node {
	t.Helper()
	var nodes []corev1.Node
	var last error
	err := WaitFor(context.Background(), timeout, func(ctx context.Context) (bool, error) {
		got, err := nodesOfApp(ctx, app)
		if err != nil {
			last = err
			return false, nil
		}
		nodes = got
		return len(got) == n, nil
	})
	if err != nil {
		t.Fatalf("app %s: %d pods not running on nodes: %v (last: %v)", app, n, err, last)
	}
	return nodes
}

// One NodePool over several templates: an arm64 pod, a large-memory pod and
// a zone-spread Deployment each get Machines of the right template in the
// right zones; the Machines are standalone (no MachineSet adopts them).
func TestMachineModeTemplatesShapesAndZones(t *testing.T) {
	ctx := context.Background()
	machinePool(t, "mm", machinePoolOptions{})
	memberTemplate(t, "mm", "mm-m5-large", "m5.large", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	memberTemplate(t, "mm", "mm-m6g-large", "m6g.large", map[string]string{v1alpha1.PriceAnnotation: "0.077"})
	memberTemplate(t, "mm", "mm-r5-large", "r5.large", map[string]string{v1alpha1.PriceAnnotation: "0.126"})

	workload(t, "mm", "mm-arm", 1, "500m", "", func(s *corev1.PodSpec) {
		s.NodeSelector[corev1.LabelArchStable] = "arm64"
	})
	workload(t, "mm", "mm-mem", 1, "1", "12Gi", nil)
	workload(t, "mm", "mm-spread", 3, "1500m", "", func(s *corev1.PodSpec) {
		s.NodeSelector[corev1.LabelArchStable] = "amd64"
		// Keep kube-scheduler from putting a spread pod on the large-memory
		// node before the memory pod gets there (Karpenter's nominations are
		// hints): the memory pod would then need a second node.
		s.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: corev1.LabelInstanceTypeStable, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"r5.large"}},
			}}},
		}}}
		s.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone, WhenUnsatisfiable: corev1.DoNotSchedule,
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "mm-spread"}},
		}}
	})

	start := time.Now()
	arm := waitAppNodes(t, 5*time.Minute, "mm-arm", 1)
	mem := waitAppNodes(t, 5*time.Minute, "mm-mem", 1)
	spread := waitAppNodes(t, 5*time.Minute, "mm-spread", 3)
	t.Logf("all pods running after %s", time.Since(start).Round(time.Second))

	if got := arm[0].Labels[corev1.LabelInstanceTypeStable]; got != "m6g.large" {
		t.Errorf("the arm64 pod runs on %s, want m6g.large", got)
	}
	if got := mem[0].Labels[corev1.LabelInstanceTypeStable]; got != "r5.large" {
		t.Errorf("the 12Gi pod runs on %s, want r5.large (the cheapest with the memory)", got)
	}
	zones := map[string]bool{}
	for _, n := range spread {
		if got := n.Labels[corev1.LabelInstanceTypeStable]; got != "m5.large" {
			t.Errorf("a spread pod runs on %s, want m5.large", got)
		}
		zones[n.Labels[corev1.LabelTopologyZone]] = true
	}
	if len(zones) != 3 {
		t.Errorf("the spread pods run in zones %v, want 3 distinct zones", zones)
	}

	// Every NodeClaim has exactly one standalone Machine, in its zone, from
	// the template of its instance type, with the cloned infra machine.
	ncs := &karpv1.NodeClaimList{}
	if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: "mm"}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, nc := range ncs.Items {
		ids = append(ids, nc.Status.ProviderID)
	}
	machines := poolMachinesWithIDs(t, time.Minute, "mm", ids...)
	if len(ncs.Items) != 5 || len(machines) != 5 {
		t.Fatalf("want 5 NodeClaims and 5 Machines, got %d and %d", len(ncs.Items), len(machines))
	}
	byName := map[string]clusterv1.Machine{}
	for _, m := range machines {
		byName[m.Namespace+"/"+m.Name] = m
	}
	for _, nc := range ncs.Items {
		ns, name, _ := v1alpha1.MachineRef(nc.Annotations)
		m, ok := byName[ns+"/"+name]
		if !ok {
			t.Fatalf("NodeClaim %s names Machine %q, which is not one of the pool's", nc.Name, nc.Annotations[v1alpha1.MachineAnnotation])
		}
		if c := metav1.GetControllerOf(&m); c != nil {
			t.Errorf("Machine %s is controlled by %s %s: it must be standalone", m.Name, c.Kind, c.Name)
		}
		if _, ok := m.Labels[clusterv1.MachineSetNameLabel]; ok {
			t.Errorf("Machine %s carries a MachineSet's label", m.Name)
		}
		if m.Annotations[v1alpha1.NodeClaimAnnotation] != nc.Name || m.Spec.ProviderID != nc.Status.ProviderID {
			t.Errorf("Machine %s is not bound to NodeClaim %s (annotation %q, providerID %q vs %q)",
				m.Name, nc.Name, m.Annotations[v1alpha1.NodeClaimAnnotation], m.Spec.ProviderID, nc.Status.ProviderID)
		}
		if m.Spec.FailureDomain != nc.Labels[corev1.LabelTopologyZone] {
			t.Errorf("Machine %s is in %q, its NodeClaim in %q", m.Name, m.Spec.FailureDomain, nc.Labels[corev1.LabelTopologyZone])
		}
		infra := &unstructured.Unstructured{}
		infra.SetGroupVersionKind(awsMachineListGVK.GroupVersion().WithKind("AWSMachine"))
		if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.InfrastructureRef.Name}, infra); err != nil {
			t.Fatalf("infrastructure machine of Machine %s: %v", m.Name, err)
		}
		wantTemplate := "mm-" + map[string]string{"m5.large": "m5-large", "m6g.large": "m6g-large", "r5.large": "r5-large"}[nc.Labels[corev1.LabelInstanceTypeStable]]
		if got := infra.GetAnnotations()[clusterv1.TemplateClonedFromNameAnnotation]; got != wantTemplate {
			t.Errorf("AWSMachine %s was cloned from %q, want %q", infra.GetName(), got, wantTemplate)
		}
		if got, _, _ := unstructured.NestedString(infra.Object, "spec", "instanceType"); got != nc.Labels[corev1.LabelInstanceTypeStable] {
			t.Errorf("AWSMachine %s has instance type %q, its NodeClaim %q", infra.GetName(), got, nc.Labels[corev1.LabelInstanceTypeStable])
		}
	}

	nodeClaimsAgreeWithClusterAPIOnTheirNodes(t, "mm")

	// Scale to zero: every Machine and its infrastructure machine go away.
	for _, app := range []string{"mm-arm", "mm-mem", "mm-spread"} {
		scaleDeployment(t, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: app}}, 0)
	}
	err := WaitFor(ctx, 4*time.Minute, func(ctx context.Context) (bool, error) {
		ms, err := poolMachines(ctx, "mm")
		if err != nil {
			return false, err
		}
		claims := &karpv1.NodeClaimList{}
		if err := w.Spoke.Client.List(ctx, claims, client.MatchingLabels{karpv1.NodePoolLabelKey: "mm"}); err != nil {
			return false, err
		}
		infra := &unstructured.UnstructuredList{}
		infra.SetGroupVersionKind(awsMachineListGVK)
		if err := w.Hub.Client.List(ctx, infra, client.InNamespace(w.Namespace), client.MatchingLabels{v1alpha1.ManagedLabel: "true"}); err != nil {
			return false, err
		}
		return len(ms) == 0 && len(claims.Items) == 0 && len(infra.Items) == 0, nil
	})
	if err != nil {
		t.Fatalf("scale to zero left Machines, NodeClaims or AWSMachines: %v", err)
	}
}

// ICE: the cheapest type's capacity is exhausted; the NodeClaim is relaunched
// on the next cheapest within a minute, and the exhausted offering is left
// out until the TTL passes.
func TestMachineModeInsufficientCapacityFallsBack(t *testing.T) {
	ctx := context.Background()
	machinePool(t, "ice", machinePoolOptions{})
	memberTemplate(t, "ice", "ice-c5-large", "c5.large", map[string]string{v1alpha1.PriceAnnotation: "0.085"})
	memberTemplate(t, "ice", "ice-m5-large", "m5.large", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	w.AWS.SetInsufficientCapacity("c5.large", "", "", true)
	t.Cleanup(func() { w.AWS.SetInsufficientCapacity("c5.large", "", "", false) })

	start := time.Now()
	workload(t, "ice", "ice-app", 1, "1500m", "", func(s *corev1.PodSpec) {
		s.NodeSelector[corev1.LabelTopologyZone] = "us-east-1b"
	})
	nodes := waitAppNodes(t, 3*time.Minute, "ice-app", 1)
	elapsed := time.Since(start)
	if got := nodes[0].Labels[corev1.LabelInstanceTypeStable]; got != "m5.large" {
		t.Fatalf("the pod runs on %s, want m5.large (c5.large is exhausted)", got)
	}
	t.Logf("relaunched on m5.large, pod running %s after creation", elapsed.Round(time.Second))
	if elapsed > 90*time.Second {
		t.Errorf("relaunch took %s, want about a minute at most", elapsed.Round(time.Second))
	}
	// The failed Machine was removed and the event says why.
	// The relaunch can run its pod before Cluster API has finished
	// deleting the failed Machine: wait for that, bounded.
	waitHubEvent(t, "LaunchFailed", "InsufficientInstanceCapacity")
	left := 0
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		machines, err := poolMachines(ctx, "ice")
		left = len(machines)
		return err == nil && left == 1, err
	}); err != nil {
		t.Fatalf("want only the m5.large Machine left, got %d Machines: %v", left, err)
	}

	// The offering shows as unavailable until its TTL passes.
	series := `karpenter_clusterapi_offering_unavailable{capacity_type="on-demand",instance_type="c5.large",zone="us-east-1b"}`
	if v, ok, err := provider.Metric(series); err != nil || !ok || v != 1 {
		t.Fatalf("right after the failure, want %s 1, got %v (present %v, err %v)", series, v, ok, err)
	}
	// Other scenarios may leave offerings of m5.large unavailable (the
	// cache is per offering, as capacity is): look at c5.large's.
	c5 := func(nc *v1alpha1.ClusterAPINodeClass) []v1alpha1.UnavailableOffering {
		var out []v1alpha1.UnavailableOffering
		for _, o := range nc.Status.UnavailableOfferings {
			if o.InstanceType == "c5.large" {
				out = append(out, o)
			}
		}
		return out
	}
	var shown []v1alpha1.UnavailableOffering
	err := WaitFor(ctx, 20*time.Second, func(ctx context.Context) (bool, error) {
		nc := &v1alpha1.ClusterAPINodeClass{}
		if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: "ice"}, nc); err != nil {
			return false, err
		}
		shown = c5(nc)
		return len(shown) == 1, nil
	})
	if err != nil || shown[0].InstanceType != "c5.large" || shown[0].Zone != "us-east-1b" || shown[0].CapacityType != "on-demand" ||
		!strings.Contains(shown[0].Reason, "InsufficientInstanceCapacity") {
		t.Fatalf("the NodeClass status must show the exhausted offering, got %+v (%v)", shown, err)
	}
	markedAt := time.Now()
	err = WaitFor(ctx, 2*suiteUnavailableTTL, func(ctx context.Context) (bool, error) {
		_, ok, err := provider.Metric(series)
		if err != nil || ok {
			return false, err
		}
		nc := &v1alpha1.ClusterAPINodeClass{}
		if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: "ice"}, nc); err != nil {
			return false, err
		}
		return len(c5(nc)) == 0, nil
	})
	if err != nil {
		t.Fatalf("the offering stayed unavailable past its TTL (%s): %v", suiteUnavailableTTL, err)
	}
	if gone := time.Since(markedAt) + elapsed; gone < suiteUnavailableTTL-10*time.Second {
		t.Errorf("the offering came back after about %s, before its TTL %s", gone.Round(time.Second), suiteUnavailableTTL)
	}
}

// Spot is chosen when cheaper and allowed; when spot is exhausted, the
// launch falls back to on-demand.
func TestMachineModeSpotFirstThenOnDemand(t *testing.T) {
	machinePool(t, "spot", machinePoolOptions{CapacityTypes: []string{karpv1.CapacityTypeSpot, karpv1.CapacityTypeOnDemand}})
	memberTemplate(t, "spot", "spot-m5-large", "m5.large", map[string]string{
		v1alpha1.PriceAnnotation: "0.096", v1alpha1.SpotPriceAnnotation: "0.035",
	})

	workload(t, "spot", "spot-app", 1, "1500m", "", func(s *corev1.PodSpec) {
		s.NodeSelector[corev1.LabelTopologyZone] = "us-east-1a"
	})
	nodes := waitAppNodes(t, 3*time.Minute, "spot-app", 1)
	if got := nodes[0].Labels[karpv1.CapacityTypeLabelKey]; got != karpv1.CapacityTypeSpot {
		t.Fatalf("the first node is %s, want spot (cheaper and allowed)", got)
	}
	if in := instanceOf(t, nodes[0]); in.CapacityType != world.CapacityTypeSpot {
		t.Fatalf("the simulated instance of node %s is %s, want a spot instance", nodes[0].Name, in.CapacityType)
	}

	w.AWS.SetInsufficientCapacity("m5.large", "", world.CapacityTypeSpot, true)
	t.Cleanup(func() { w.AWS.SetInsufficientCapacity("m5.large", "", world.CapacityTypeSpot, false) })
	workload(t, "spot", "spot-app2", 1, "1500m", "", func(s *corev1.PodSpec) {
		s.NodeSelector[corev1.LabelTopologyZone] = "us-east-1a"
	})
	nodes = waitAppNodes(t, 3*time.Minute, "spot-app2", 1)
	if got := nodes[0].Labels[karpv1.CapacityTypeLabelKey]; got != karpv1.CapacityTypeOnDemand {
		t.Fatalf("with spot exhausted the node is %s, want on-demand", got)
	}
	if in := instanceOf(t, nodes[0]); in.CapacityType != world.CapacityTypeOnDemand {
		t.Fatalf("the simulated instance of node %s is %s, want on-demand", nodes[0].Name, in.CapacityType)
	}
}

// instanceOf returns the simulated instance behind a Node.
func instanceOf(t testing.TB, n corev1.Node) world.Instance {
	t.Helper()
	for _, in := range w.AWS.Instances() {
		if in.ProviderID == n.Spec.ProviderID {
			return in
		}
	}
	t.Fatalf("no simulated instance has providerID %s", n.Spec.ProviderID)
	return world.Instance{}
}

// waitHubEvent waits for an event with the reason whose message contains text.
func waitHubEvent(t testing.TB, reason, text string) {
	t.Helper()
	err := WaitFor(context.Background(), time.Minute, func(ctx context.Context) (bool, error) {
		events := &corev1.EventList{}
		if err := w.Hub.Client.List(ctx, events, client.InNamespace(w.Namespace)); err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Reason == reason && strings.Contains(e.Message, text) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s event mentioning %q in the hub: %v", reason, text, err)
	}
}
