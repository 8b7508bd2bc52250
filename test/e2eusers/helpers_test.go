package e2eusers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/awslabs/operatorpkg/status"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/e2e"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// values are the clusterctl variables of testdata/clusterctl.yaml for a Cluster.
func values(t *testing.T, cluster string) Values {
	t.Helper()
	v, err := LoadValues(filepath.Join("testdata", "clusterctl.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return v.With("CLUSTER_NAME", cluster)
}

// createAll applies objects to a cluster, in order, as `kubectl apply -f`
// does: created, or updated when they exist (CAPA's templates name some
// objects, e.g. the ClusterResourceSets, the same for every cluster).
func createAll(t *testing.T, c client.Client, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		err := c.Create(context.Background(), o.DeepCopy())
		if apierrors.IsAlreadyExists(err) {
			err = c.Patch(context.Background(), o.DeepCopy(), client.Apply, client.FieldOwner("kubectl"), client.ForceOwnership)
		}
		if err != nil {
			t.Fatalf("applying %s %s %s: %v", o.GetAPIVersion(), o.GetKind(), o.GetName(), err)
		}
	}
}

// applyWorkload renders an example manifest for the workload cluster with
// the Cluster's variables and creates its objects there.
func applyWorkload(t *testing.T, wc *world.WorkloadCluster, rel string, v Values) {
	t.Helper()
	objs, err := Render(ExampleFile(rel), v, "")
	if err != nil {
		t.Fatal(err)
	}
	createAll(t, wc.Spoke.Client, objs)
}

// startProvider starts the provider binary for a Cluster of the world.
func startProvider(t *testing.T, wc *world.WorkloadCluster) *e2e.Provider {
	t.Helper()
	p, err := e2e.StartProviderForCluster(bin, w, wc, "provider-"+wc.Name+".log")
	if err != nil {
		t.Fatal(err)
	}
	providersMu.Lock()
	providers = append(providers, p)
	providersMu.Unlock()
	t.Cleanup(func() {
		if t.Failed() {
			if data, err := os.ReadFile(p.LogPath); err == nil {
				t.Logf("provider log: %s (%d bytes)", p.LogPath, len(data))
			}
		}
	})
	return p
}

// waitNodeClassReady waits until a NodeClass is Ready and returns it.
func waitNodeClassReady(t *testing.T, wc *world.WorkloadCluster, name string) *v1alpha1.ClusterAPINodeClass {
	t.Helper()
	nc := &v1alpha1.ClusterAPINodeClass{}
	err := e2e.WaitFor(context.Background(), 2*time.Minute, func(ctx context.Context) (bool, error) {
		if err := wc.Spoke.Client.Get(ctx, client.ObjectKey{Name: name}, nc); err != nil {
			return false, err
		}
		return nc.StatusConditions().Get(status.ConditionReady).IsTrue(), nil
	})
	if err != nil {
		t.Fatalf("NodeClass %s not Ready: %v; conditions %+v", name, err, nc.Status.Conditions)
	}
	return nc
}

// deployment creates pause pods that each ask for cpu, on the NodePool's
// nodes, in a workload cluster.
func deployment(t *testing.T, wc *world.WorkloadCluster, pool, name string, replicas int32, cpu string) *appsv1.Deployment {
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
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}},
					}},
				},
			},
		},
	}
	if err := wc.Spoke.Client.Create(context.Background(), d); err != nil {
		t.Fatalf("creating Deployment %s: %v", name, err)
	}
	t.Cleanup(func() { _ = wc.Spoke.Client.Delete(context.Background(), d) })
	return d
}

func scale(t *testing.T, wc *world.WorkloadCluster, d *appsv1.Deployment, replicas int32) {
	t.Helper()
	cur := &appsv1.Deployment{}
	if err := wc.Spoke.Client.Get(context.Background(), client.ObjectKeyFromObject(d), cur); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	cur.Spec.Replicas = &replicas
	if err := wc.Spoke.Client.Patch(context.Background(), cur, patch); err != nil {
		t.Fatal(err)
	}
}

// counts are what a user compares: pods, NodeClaims, Nodes of a NodePool,
// and the worker Machines of the Cluster in the hub.
type counts struct {
	RunningPods, NodeClaims, Nodes, Machines int
	// EverNodeClaims counts every NodeClaim seen since the tally started: a
	// failed launch shows as a NodeClaim deleted and replaced.
	EverNodeClaims int
	Zones          map[string]int
	Versions       map[string]int
}

func (c counts) String() string {
	return fmt.Sprintf("pods running %d, NodeClaims %d (ever %d), Nodes %d, Machines %d, zones %v, versions %v",
		c.RunningPods, c.NodeClaims, c.EverNodeClaims, c.Nodes, c.Machines, c.Zones, c.Versions)
}

// tally counts a NodePool's objects; seen accumulates NodeClaim names.
type tally struct {
	wc   *world.WorkloadCluster
	pool string
	app  string
	// machines selects the Cluster's Machines that count (nil: all worker
	// Machines of the Cluster); standalone counts only Machines no
	// MachineSet owns (Machine mode), owned only those one owns.
	machines   client.MatchingLabels
	standalone bool
	owned      bool
	seen       map[string]bool
}

func newTally(wc *world.WorkloadCluster, pool, app string, machines client.MatchingLabels) *tally {
	return &tally{wc: wc, pool: pool, app: app, machines: machines, seen: map[string]bool{}}
}

func (ta *tally) count(ctx context.Context) (counts, error) {
	c := counts{Zones: map[string]int{}, Versions: map[string]int{}}
	pods := &corev1.PodList{}
	if err := ta.wc.Spoke.Client.List(ctx, pods, client.MatchingLabels{"app": ta.app}); err != nil {
		return c, err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp.IsZero() && p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != "" {
			c.RunningPods++
		}
	}
	ncs := &karpv1.NodeClaimList{}
	if err := ta.wc.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: ta.pool}); err != nil {
		return c, err
	}
	for _, nc := range ncs.Items {
		c.NodeClaims++
		ta.seen[nc.Name] = true
		c.Zones[nc.Labels[corev1.LabelTopologyZone]]++
	}
	c.EverNodeClaims = len(ta.seen)
	nodes := &corev1.NodeList{}
	if err := ta.wc.Spoke.Client.List(ctx, nodes, client.MatchingLabels{karpv1.NodePoolLabelKey: ta.pool}); err != nil {
		return c, err
	}
	c.Nodes = len(nodes.Items)
	for _, n := range nodes.Items {
		c.Versions[n.Status.NodeInfo.KubeletVersion]++
	}
	machines := &clusterv1.MachineList{}
	sel := client.MatchingLabels{clusterv1.ClusterNameLabel: ta.wc.Name}
	for k, v := range ta.machines {
		sel[k] = v
	}
	if err := w.Hub.Client.List(ctx, machines, client.InNamespace(w.Namespace), sel); err != nil {
		return c, err
	}
	for _, m := range machines.Items {
		ownedBySet := false
		for _, ref := range m.OwnerReferences {
			ownedBySet = ownedBySet || ref.Kind == "MachineSet"
		}
		if _, cp := m.Labels[clusterv1.MachineControlPlaneLabel]; cp || (ta.standalone && ownedBySet) || (ta.owned && !ownedBySet) {
			continue
		}
		c.Machines++
	}
	return c, nil
}

// wait polls the counts until cond holds.
func (ta *tally) wait(t *testing.T, timeout time.Duration, cond func(counts) bool) counts {
	t.Helper()
	var last counts
	err := e2e.WaitFor(context.Background(), timeout, func(ctx context.Context) (bool, error) {
		c, err := ta.count(ctx)
		if err != nil {
			return false, err
		}
		last = c
		return cond(c), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v; last: %s", ta.pool, err, last)
	}
	return last
}

// sortedKeys is for stable messages.
func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
