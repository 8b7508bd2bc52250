package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// pool sets up one scenario's NodeClass and NodePool, selecting
// MachineDeployments labelled pool=<name>, and removes them at the end.
func pool(t testing.TB, name string) {
	t.Helper()
	poolIn(t, w.Spoke.Client, name, name)
}

// poolIn is pool in a workload cluster: NodeClass and NodePool name,
// selecting MachineDeployments labelled pool=<selected>.
func poolIn(t testing.TB, spoke client.Client, name, selected string) {
	t.Helper()
	ctx := context.Background()
	nc := &v1alpha1.ClusterAPINodeClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.ClusterAPINodeClassSpec{
			ScalableResourceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": selected}},
		},
	}
	np := &karpv1.NodePool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: karpv1.NodePoolSpec{
			Template: karpv1.NodeClaimTemplate{
				Spec: karpv1.NodeClaimTemplateSpec{
					NodeClassRef: &karpv1.NodeClassReference{Group: v1alpha1.Group, Kind: "ClusterAPINodeClass", Name: name},
					Requirements: []karpv1.NodeSelectorRequirementWithMinValues{
						{Key: corev1.LabelOSStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"linux"}},
						// Core replaces an on-demand node only with spot when a NodePool allows both
						// (see docs/concepts.md): these MachineDeployments offer on-demand only.
						{Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{karpv1.CapacityTypeOnDemand}},
					},
					ExpireAfter: karpv1.MustParseNillableDuration("Never"),
				},
			},
			Disruption: karpv1.Disruption{
				ConsolidationPolicy: karpv1.ConsolidationPolicyWhenEmptyOrUnderutilized,
				ConsolidateAfter:    karpv1.MustParseNillableDuration("5s"),
				Budgets:             []karpv1.Budget{{Nodes: "100%"}},
			},
		},
	}
	for _, o := range []client.Object{nc, np} {
		if err := spoke.Create(ctx, o); err != nil {
			t.Fatalf("creating %T %s: %v", o, name, err)
		}
	}
	t.Cleanup(func() {
		_ = spoke.Delete(ctx, np)
		_ = spoke.Delete(ctx, nc)
	})
}

// machineDeployment creates an AWSMachineTemplate of the instance type and a
// Karpenter-member MachineDeployment of the pool at 0 replicas.
func machineDeployment(t testing.TB, pool, name, instanceType, zone string, annotations map[string]string) *clusterv1.MachineDeployment {
	t.Helper()
	return machineDeploymentOf(t, w.ClusterName, pool, name, instanceType, zone, annotations)
}

// machineDeploymentOf is machineDeployment for a Cluster of the world.
func machineDeploymentOf(t testing.TB, cluster, pool, name, instanceType, zone string, annotations map[string]string) *clusterv1.MachineDeployment {
	t.Helper()
	ctx := context.Background()
	if _, err := w.CreateAWSMachineTemplate(ctx, name, instanceType, false); err != nil {
		t.Fatalf("creating AWSMachineTemplate %s: %v", name, err)
	}
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: w.Namespace, Name: name, ClusterName: cluster, Member: true,
		Labels: map[string]string{"pool": pool}, Annotations: annotations, FailureDomain: zone,
	})
	if err := w.Hub.Client.Create(ctx, md); err != nil {
		t.Fatalf("creating MachineDeployment %s: %v", name, err)
	}
	return md
}

// deployment creates pods of the pool, each requesting cpu.
func deployment(t testing.TB, pool, name string, replicas int32, cpu string) *appsv1.Deployment {
	t.Helper()
	return podDeployment(t, pool, name, replicas, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}, nil)
}

// podDeployment creates a Deployment of pause pods of the pool (node
// selector karpenter.sh/nodepool) with the requests; mutate adjusts the pod
// spec. It is deleted at the end of the test.
func podDeployment(t testing.TB, pool, name string, replicas int32, requests corev1.ResourceList, mutate func(*corev1.PodSpec)) *appsv1.Deployment {
	t.Helper()
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{karpv1.NodePoolLabelKey: pool},
					TerminationGracePeriodSeconds: new(int64),
					Containers: []corev1.Container{{
						Name: "app", Image: "registry.k8s.io/pause:3.10",
						Resources: corev1.ResourceRequirements{Requests: requests},
					}},
				},
			},
		},
	}
	if mutate != nil {
		mutate(&d.Spec.Template.Spec)
	}
	if err := w.Spoke.Client.Create(context.Background(), d); err != nil {
		t.Fatalf("creating Deployment %s: %v", name, err)
	}
	t.Cleanup(func() { _ = w.Spoke.Client.Delete(context.Background(), d) })
	return d
}

func scaleDeployment(t testing.TB, d *appsv1.Deployment, replicas int32) {
	t.Helper()
	cur := &appsv1.Deployment{}
	if err := w.Spoke.Client.Get(context.Background(), client.ObjectKeyFromObject(d), cur); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	cur.Spec.Replicas = &replicas
	if err := w.Spoke.Client.Patch(context.Background(), cur, patch); err != nil {
		t.Fatal(err)
	}
}

// counts is what a pool has in both clusters at one moment.
type counts struct {
	RunningPods, PendingPods  int
	NodeClaims, Initialized   int
	Nodes                     int
	Machines, BoundMachines   int
	UnboundMachines           int
	Replicas                  int32
	Pending                   int // pending-nodeclaims entries on the MachineDeployments
	InstanceTypes, Zones      map[string]int
	MachineDeploymentReplicas map[string]int32
}

func (c counts) String() string {
	return fmt.Sprintf("pods running=%d pending=%d, nodeclaims=%d initialized=%d, nodes=%d, machines=%d bound=%d unbound=%d, replicas=%d pendingClaims=%d, types=%v",
		c.RunningPods, c.PendingPods, c.NodeClaims, c.Initialized, c.Nodes, c.Machines, c.BoundMachines, c.UnboundMachines, c.Replicas, c.Pending, c.InstanceTypes)
}

// count gathers a pool's counts; app selects the pods.
func count(ctx context.Context, pool, app string, mds ...*clusterv1.MachineDeployment) (counts, error) {
	c := counts{InstanceTypes: map[string]int{}, Zones: map[string]int{}, MachineDeploymentReplicas: map[string]int32{}}
	pods := &corev1.PodList{}
	if err := w.Spoke.Client.List(ctx, pods, client.MatchingLabels{"app": app}); err != nil {
		return c, err
	}
	for _, p := range pods.Items {
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != "" {
			c.RunningPods++
		} else {
			c.PendingPods++
		}
	}
	ncs := &karpv1.NodeClaimList{}
	if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
		return c, err
	}
	for _, nc := range ncs.Items {
		c.NodeClaims++
		if nc.StatusConditions().IsTrue(karpv1.ConditionTypeInitialized) {
			c.Initialized++
		}
		c.InstanceTypes[nc.Labels[corev1.LabelInstanceTypeStable]]++
		c.Zones[nc.Labels[corev1.LabelTopologyZone]]++
	}
	nodes := &corev1.NodeList{}
	if err := w.Spoke.Client.List(ctx, nodes, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
		return c, err
	}
	c.Nodes = len(nodes.Items)
	for _, md := range mds {
		cur := &clusterv1.MachineDeployment{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
			return c, err
		}
		if cur.Spec.Replicas != nil {
			c.Replicas += *cur.Spec.Replicas
			c.MachineDeploymentReplicas[cur.Name] = *cur.Spec.Replicas
		}
		if raw := cur.Annotations["karpenter.cluster.x-k8s.io/pending-nodeclaims"]; raw != "" && raw != "{}" {
			c.Pending++
		}
		machines := &clusterv1.MachineList{}
		if err := w.Hub.Client.List(ctx, machines, client.InNamespace(cur.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: cur.Name}); err != nil {
			return c, err
		}
		for _, m := range machines.Items {
			c.Machines++
			if m.Annotations[v1alpha1.NodeClaimAnnotation] != "" {
				c.BoundMachines++
			} else {
				c.UnboundMachines++
			}
		}
	}
	return c, nil
}

// waitCounts waits until want holds for the pool's counts, and fails with
// the last counts otherwise.
func waitCounts(t testing.TB, timeout time.Duration, pool, app string, mds []*clusterv1.MachineDeployment, want func(counts) bool) counts {
	t.Helper()
	var last counts
	err := WaitFor(context.Background(), timeout, func(ctx context.Context) (bool, error) {
		c, err := count(ctx, pool, app, mds...)
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

func clientKey(name string) client.ObjectKey { return client.ObjectKey{Name: name} }

// worldCaches returns unstarted informer caches of the world's hub and spoke,
// for tests that watch what happens there.
func worldCaches(t testing.TB) (hub, spoke cache.Cache) {
	t.Helper()
	hub, err := cache.New(w.Hub.Config, cache.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	spoke, err = cache.New(w.Spoke.Config, cache.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return hub, spoke
}
