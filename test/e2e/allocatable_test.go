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
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/controllers/allocatable"
	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// Karpenter packs pods against the allocatable the provider computes from
// the nodes' kubelet settings; these tests size workloads to fill exactly N
// nodes' real allocatable (what the simulated kubelet reports from its
// arguments) and expect exactly N nodes.

// A MachineDeployment bootstrapped from a KubeadmConfigTemplate with
// non-default reservations: its kubelet arguments are what Karpenter plans
// with. The old EKS-like estimate (1465Mi kube-reserved for 110 pods) fitted
// one of these pods per m5.large and launched four nodes.
func TestAllocatableFromKubeadmConfigTemplate(t *testing.T) {
	ctx := context.Background()
	pool(t, "kadm")
	args := map[string]string{
		"kube-reserved":   "cpu=100m,memory=256Mi",
		"system-reserved": "cpu=100m,memory=128Mi",
		"eviction-hard":   "memory.available<128Mi",
		"max-pods":        "4",
	}
	if _, err := w.CreateKubeadmConfigTemplate(ctx, "kadm-workers", args); err != nil {
		t.Fatal(err)
	}
	md := kubeletMachineDeployment(t, "kadm", "kadm-m5-large", "m5.large", environment.MachineDeploymentOptions{BootstrapTemplate: "kadm-workers"})
	// m5.large (2 CPU, 8Gi) minus the reservations: 1800m, 7680Mi, 4 pods.
	want := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1800m"), corev1.ResourceMemory: resource.MustParse("7680Mi"), corev1.ResourcePods: resource.MustParse("4")}
	if got := world.NodeAllocatable(world.InstanceTypes["m5.large"], args); !sameResources(got, want) {
		t.Fatalf("the simulated kubelet would report %v, the test expects %v", got, want)
	}
	// Two pods fill a node's cpu and memory exactly: four pods, two nodes.
	sizedDeployment(t, "kadm", "app-kadm", 4, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("900m"), corev1.ResourceMemory: resource.MustParse("3840Mi")})
	expectExactNodes(t, "kadm", "app-kadm", md, 4, 2, want)
}

// A bootstrap the provider cannot read (a pre-rendered data Secret, as with
// any bootstrap provider but kubeadm) described by the NodeClass's
// spec.kubelet: 130 pods fill one node whose kubelet runs max-pods=130. With
// the kubelet's default of 110 pods Karpenter would plan two nodes.
func TestAllocatableFromNodeClassKubelet(t *testing.T) {
	ctx := context.Background()
	args := map[string]string{
		"kube-reserved":   "cpu=250m,memory=1Gi",
		"system-reserved": "cpu=250m",
		"eviction-hard":   "memory.available<500Mi",
		"max-pods":        "130",
	}
	pool(t, "nckub")
	setNodeClassKubelet(t, "nckub", &v1alpha1.KubeletConfiguration{
		MaxPods:        ptr.To[int32](130),
		KubeReserved:   map[string]string{"cpu": "250m", "memory": "1Gi"},
		SystemReserved: map[string]string{"cpu": "250m"},
		EvictionHard:   map[string]string{"memory.available": "500Mi"},
	})
	secret := bootstrapSecret(t, ctx, "nckub-bootstrap", args)
	md := kubeletMachineDeployment(t, "nckub", "nckub-m5-large", "m5.large", environment.MachineDeploymentOptions{BootstrapSecret: secret})
	want := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("6668Mi"), corev1.ResourcePods: resource.MustParse("130")}
	if got := world.NodeAllocatable(world.InstanceTypes["m5.large"], args); !sameResources(got, want) {
		t.Fatalf("the simulated kubelet would report %v, the test expects %v", got, want)
	}
	sizedDeployment(t, "nckub", "app-nckub", 130, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("50Mi")})
	expectExactNodes(t, "nckub", "app-nckub", md, 130, 1, want)
}

// A node whose kubelet reserves what neither the bootstrap template nor the
// NodeClass says: the NodeClaim gets one Warning event and the mismatch
// metric counts it once.
func TestAllocatableMismatchIsReported(t *testing.T) {
	ctx := context.Background()
	pool(t, "mism")
	secret := bootstrapSecret(t, ctx, "mism-bootstrap", map[string]string{"kube-reserved": "cpu=500m"})
	md := kubeletMachineDeployment(t, "mism", "mism-m5-large", "m5.large", environment.MachineDeploymentOptions{BootstrapSecret: secret})
	sizedDeployment(t, "mism", "app-mism", 1, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")})
	waitCounts(t, 4*time.Minute, "mism", "app-mism", []*clusterv1.MachineDeployment{md}, func(c counts) bool {
		return c.RunningPods == 1 && c.Initialized == 1
	})
	names := nodeClaimNames(t, "mism")
	if len(names) != 1 {
		t.Fatalf("NodeClaims %v", names)
	}
	var events []corev1.Event
	err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		var err error
		events, err = mismatchEvents(ctx, names[0])
		return len(events) > 0, err
	})
	if err != nil {
		t.Fatalf("no %s event on NodeClaim %s: %v", allocatable.ReasonMismatch, names[0], err)
	}
	if e := events[0]; e.Type != corev1.EventTypeWarning || !strings.Contains(e.Message, "cpu 1500m (planned 2, -25.0%)") {
		t.Fatalf("event %s: %s", e.Type, e.Message)
	}
	series := `karpenter_clusterapi_allocatable_mismatch_total{direction="under",instance_type="m5.large",resource="cpu"}`
	if v, ok, err := provider.Metric(series); err != nil || !ok || v < 1 {
		t.Fatalf("%s = %v (present %v, %v)", series, v, ok, err)
	}
	nc := &karpv1.NodeClaim{}
	if err := w.Spoke.Client.Get(ctx, clientKey(names[0]), nc); err != nil {
		t.Fatal(err)
	}
	if nc.Annotations[allocatable.MismatchAnnotation] == "" {
		t.Fatalf("NodeClaim annotations %v", nc.Annotations)
	}
	// Once: later NodeClaim updates (Karpenter's own) report nothing more.
	time.Sleep(5 * time.Second) // nothing to wait for: proving an absence
	if events, err := mismatchEvents(ctx, names[0]); err != nil || len(events) != 1 || events[0].Count > 1 {
		t.Fatalf("want one event, reported once; got %d (%v)", len(events), err)
	}
}

// expectExactNodes waits for all pods running and fails unless exactly nodes
// NodeClaims were launched, each promising want, which its Node reports.
func expectExactNodes(t *testing.T, pool, app string, md *clusterv1.MachineDeployment, pods, nodes int, want corev1.ResourceList) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	got := waitCounts(t, 5*time.Minute, pool, app, []*clusterv1.MachineDeployment{md}, func(c counts) bool {
		return c.RunningPods == pods && c.Initialized >= nodes
	})
	t.Logf("%d pods running after %s: %s", pods, time.Since(start).Round(time.Second), got)
	if got.NodeClaims != nodes || got.Nodes != nodes || got.Machines != nodes {
		t.Fatalf("want exactly %d nodes for pods that fill %d nodes' allocatable, got %s", nodes, nodes, got)
	}
	ncs := &karpv1.NodeClaimList{}
	if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
		t.Fatal(err)
	}
	for _, nc := range ncs.Items {
		node := &corev1.Node{}
		if err := w.Spoke.Client.Get(ctx, clientKey(nc.Status.NodeName), node); err != nil {
			t.Fatal(err)
		}
		if !sameResources(nc.Status.Allocatable, want) || !sameResources(node.Status.Allocatable, want) {
			t.Errorf("NodeClaim %s promised %v, Node %s reports %v; want %v", nc.Name, pick(nc.Status.Allocatable), node.Name, pick(node.Status.Allocatable), want)
		}
		if p := nc.Status.Capacity[corev1.ResourcePods]; p.Cmp(want[corev1.ResourcePods]) != 0 {
			t.Errorf("NodeClaim %s capacity pods %s, want %s", nc.Name, p.String(), want.Pods().String())
		}
		if events, err := mismatchEvents(ctx, nc.Name); err != nil || len(events) > 0 {
			t.Errorf("NodeClaim %s: unexpected %s events %v (%v)", nc.Name, allocatable.ReasonMismatch, events, err)
		}
	}
}

// kubeletMachineDeployment creates an AWSMachineTemplate of the instance
// type and a Karpenter-member MachineDeployment of the pool in us-east-1a at
// 0 replicas, bootstrapped as o says.
func kubeletMachineDeployment(t *testing.T, pool, name, instanceType string, o environment.MachineDeploymentOptions) *clusterv1.MachineDeployment {
	t.Helper()
	ctx := context.Background()
	if _, err := w.CreateAWSMachineTemplate(ctx, name, instanceType, false); err != nil {
		t.Fatalf("creating AWSMachineTemplate %s: %v", name, err)
	}
	o.Namespace, o.Name, o.ClusterName, o.Member, o.FailureDomain = w.Namespace, name, w.ClusterName, true, "us-east-1a"
	o.Labels = map[string]string{"pool": pool}
	o.Annotations = map[string]string{v1alpha1.PriceAnnotation: "0.096"}
	md := environment.NewMachineDeployment(o)
	if err := w.Hub.Client.Create(ctx, md); err != nil {
		t.Fatalf("creating MachineDeployment %s: %v", name, err)
	}
	return md
}

// bootstrapSecret creates a pre-rendered bootstrap data Secret whose kubelet
// runs with args (opaque to the provider) and returns its name.
func bootstrapSecret(t *testing.T, ctx context.Context, name string, args map[string]string) string {
	t.Helper()
	d := world.DefaultBootstrapData()
	d.KubeletArgs = args
	s, err := world.BootstrapSecret(w.Namespace, name, w.ClusterName, d)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Hub.Client.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	return name
}

// setNodeClassKubelet sets the pool's NodeClass's spec.kubelet and waits
// until its status has seen the change.
func setNodeClassKubelet(t *testing.T, name string, k *v1alpha1.KubeletConfiguration) {
	t.Helper()
	ctx := context.Background()
	nc := &v1alpha1.ClusterAPINodeClass{}
	if err := w.Spoke.Client.Get(ctx, clientKey(name), nc); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(nc.DeepCopy())
	nc.Spec.Kubelet = k
	if err := w.Spoke.Client.Patch(ctx, nc, patch); err != nil {
		t.Fatal(err)
	}
}

// sizedDeployment creates pods of the pool with the given requests.
func sizedDeployment(t *testing.T, pool, name string, replicas int32, requests corev1.ResourceList) *appsv1.Deployment {
	t.Helper()
	return podDeployment(t, pool, name, replicas, requests, nil)
}

func mismatchEvents(ctx context.Context, nodeClaim string) ([]corev1.Event, error) {
	list := &corev1.EventList{}
	if err := w.Spoke.Client.List(ctx, list); err != nil {
		return nil, err
	}
	var out []corev1.Event
	for _, e := range list.Items {
		if e.Reason == allocatable.ReasonMismatch && e.InvolvedObject.Kind == "NodeClaim" && e.InvolvedObject.Name == nodeClaim {
			out = append(out, e)
		}
	}
	return out, nil
}

// sameResources compares the resources the allocatable check looks at.
func sameResources(a, b corev1.ResourceList) bool {
	for _, r := range allocatable.Checked {
		x, y := a[r], b[r]
		if x.Cmp(y) != 0 {
			return false
		}
	}
	return true
}

func pick(rl corev1.ResourceList) string {
	var parts []string
	for _, r := range allocatable.Checked {
		q := rl[r]
		parts = append(parts, fmt.Sprintf("%s=%s", r, q.String()))
	}
	return strings.Join(parts, " ")
}
