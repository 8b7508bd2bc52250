package e2eusers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/e2e"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

const ccPatch = "capa-templates/clusterclass/karpenter.patch.yaml"

// CAPA's cluster-template-simple-clusterclass.yaml (a Cluster with a
// managed topology and the ClusterClass quick-start with its templates), as
// published, with the edits of docs/clusterclass.md (worker metadata, the
// ClusterClass's templates), reconciled by Cluster API's real topology
// controllers. One Cluster, both modes side by side:
//   - MachineDeployment mode scales the topology's MachineDeployment and
//     the topology leaves its replicas alone; pinned replicas show on the
//     NodeClass;
//   - Machine mode selects the template the topology cloned under a
//     generated name, and follows its rotation through drift;
//   - a Kubernetes upgrade of the topology rolls both pools' nodes onto the
//     new version through drift, within their budgets of one node.
func TestClusterClass(t *testing.T) {
	t.Parallel() // each has a Cluster and workload cluster of its own
	const name = "capa-cc"
	ctx := context.Background()
	wc, err := w.PrepareCluster(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	clusterFromTemplate(t, name, "simple-clusterclass", ccPatch)
	startProvider(t, wc)
	applyWorkload(t, wc, "capa-templates/clusterclass/workload.yaml", values(t, name))
	waitNodeClassReady(t, wc, "md-0")
	waitNodeClassReady(t, wc, "machines")
	md := topologyMachineDeployment(t, name, "md-0")
	if _, ok := md.Spec.Template.Labels[v1alpha1.KarpenterMemberLabel]; !ok {
		t.Logf("note: the topology did not copy the worker's labels to the Machine template")
	}

	t.Run("MachineDeployment mode: the topology leaves Karpenter's replicas alone", func(t *testing.T) {
		ta := mdTally(wc, "app-md-0")
		d := deployment(t, wc, "md-0", "app-md-0", 3, "1500m")
		got := ta.wait(t, 4*time.Minute, func(c counts) bool { return c.RunningPods == 3 && c.Nodes == 3 })
		if got.NodeClaims != 3 || got.Machines != 3 || got.EverNodeClaims != 3 {
			t.Fatalf("want exactly 3 NodeClaims, Nodes and Machines, no failed launch: %s", got)
		}
		// The topology reconciles the MachineDeployment at every change of
		// it; give it time to (wrongly) set replicas back.
		stable(t, 10*time.Second, func(ctx context.Context) error {
			cur := topologyMachineDeployment(t, name, "md-0")
			if r := ptr.Deref(cur.Spec.Replicas, -1); r != 3 {
				return fmt.Errorf("MachineDeployment replicas %d, want Karpenter's 3", r)
			}
			return nil
		})
		scale(t, wc, d, 0)
		ta.wait(t, 4*time.Minute, func(c counts) bool { return c.NodeClaims == 0 && c.Nodes == 0 && c.Machines == 0 })
	})

	t.Run("MachineDeployment mode: replicas pinned by the topology show on the NodeClass", func(t *testing.T) {
		setWorkerReplicas(t, name, ptr.To[int32](0))
		msg := waitCondition(t, wc, "md-0", v1alpha1.ConditionTypeTopologyReplicas, "False")
		for _, want := range []string{"Cluster " + w.Namespace + "/" + name, "machineDeployments[name=md-0].replicas"} {
			if !strings.Contains(msg, want) {
				t.Errorf("condition message does not name %q: %q", want, msg)
			}
		}
		setWorkerReplicas(t, name, nil)
		waitCondition(t, wc, "md-0", v1alpha1.ConditionTypeTopologyReplicas, "True")
	})

	t.Run("Machine mode: the template the topology clones, and its rotation", func(t *testing.T) {
		ta := machineTally(wc, "app-machines")
		deployment(t, wc, "machines", "app-machines", 2, "1500m")
		got := ta.wait(t, 4*time.Minute, func(c counts) bool { return c.RunningPods == 2 && c.Nodes == 2 })
		before := machineModeTemplates(t, name)
		if len(before) != 1 || !strings.HasPrefix(before[0], name+"-md-0-") {
			t.Fatalf("Machine-mode Machines must come from the topology's clone %s-md-0-*, got %v (%s)", name, before, got)
		}
		// A new worker instance type: the topology clones a new template,
		// rolls the MachineDeployment and deletes the old clone.
		setVariable(t, name, "workerMachineType", "c5.large")
		got = ta.wait(t, 4*time.Minute, func(c counts) bool {
			after := machineModeTemplates(t, name)
			return c.RunningPods == 2 && c.Nodes == 2 && c.NodeClaims == 2 && len(after) == 1 && after[0] != before[0]
		})
		t.Logf("rotated from %s to %v: %s", before[0], machineModeTemplates(t, name), got)
	})

	t.Run("a Kubernetes upgrade of the topology rolls both modes within their budgets", func(t *testing.T) {
		const to = "v1.36.4"
		mdT := mdTally(wc, "app-md-up")
		deployment(t, wc, "md-0", "app-md-up", 2, "1500m")
		mT := machineTally(wc, "app-machines-up")
		deployment(t, wc, "machines", "app-machines-up", 2, "1500m")
		mdT.wait(t, 4*time.Minute, func(c counts) bool { return c.RunningPods == 2 && c.Nodes == 2 && c.Machines == 2 })
		mT.wait(t, 4*time.Minute, func(c counts) bool { return c.RunningPods == 2 && c.Nodes == 2 && c.Machines == 2 })

		setVersion(t, name, to)
		maxDisrupted := map[string]int{}
		var skew error
		err := e2e.WaitFor(ctx, 6*time.Minute, func(ctx context.Context) (bool, error) {
			done := true
			for _, ta := range []*tally{mdT, mT} {
				c, err := ta.count(ctx)
				if err != nil {
					return false, err
				}
				n, err := disrupting(ctx, wc, ta.pool)
				if err != nil {
					return false, err
				}
				maxDisrupted[ta.pool] = max(maxDisrupted[ta.pool], n)
				if err := noNodeAheadOfControlPlane(ctx, wc, name); err != nil && skew == nil {
					skew = err
				}
				done = done && c.RunningPods == 2 && c.Nodes == 2 && c.NodeClaims == 2 && c.Machines == 2 && c.Versions[to] == 2
			}
			return done, nil
		})
		if err != nil {
			t.Fatalf("nodes of both pools must reach %s: %v", to, err)
		}
		if skew != nil {
			t.Errorf("version skew during the upgrade: %v", skew)
		}
		for pool, n := range maxDisrupted {
			if n > 1 {
				t.Errorf("NodePool %s: %d nodes disrupted at once, budget 1", pool, n)
			}
		}
	})
}

// mdTally counts the md-0 pool: Machines of worker md-0's MachineSets.
func mdTally(wc *world.WorkloadCluster, app string) *tally {
	ta := newTally(wc, "md-0", app, client.MatchingLabels{clusterv1.ClusterTopologyMachineDeploymentNameLabel: "md-0"})
	ta.owned = true
	return ta
}

// machineTally counts the machines pool: the Cluster's standalone Machines.
func machineTally(wc *world.WorkloadCluster, app string) *tally {
	ta := newTally(wc, "machines", app, nil)
	ta.standalone = true
	return ta
}

// topologyMachineDeployment is the MachineDeployment of a topology worker.
func topologyMachineDeployment(t *testing.T, cluster, worker string) *clusterv1.MachineDeployment {
	t.Helper()
	list := &clusterv1.MachineDeploymentList{}
	if err := w.Hub.Client.List(context.Background(), list, client.InNamespace(w.Namespace), client.MatchingLabels{
		clusterv1.ClusterNameLabel: cluster, clusterv1.ClusterTopologyMachineDeploymentNameLabel: worker,
	}); err != nil || len(list.Items) != 1 {
		t.Fatalf("want the one MachineDeployment of worker %s, got %d (%v)", worker, len(list.Items), err)
	}
	return &list.Items[0]
}

// updateCluster changes the Cluster's topology as a user would (kubectl edit).
func updateCluster(t *testing.T, cluster string, mutate func(*clusterv1.Cluster)) {
	t.Helper()
	err := e2e.WaitFor(context.Background(), 30*time.Second, func(ctx context.Context) (bool, error) {
		c := &clusterv1.Cluster{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: w.Namespace, Name: cluster}, c); err != nil {
			return false, err
		}
		mutate(c)
		err := w.Hub.Client.Update(ctx, c)
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("updating Cluster %s: %v", cluster, err)
	}
}

// setWorkerReplicas sets (or unsets) the workers' replicas in the
// topology. Cluster API's Cluster webhook refuses replicas together with the
// autoscaler min/max annotations on a worker, so pinning is what a user does
// who kept the published template's replicas and added no annotations: the
// annotations go while replicas are set and come back when they are unset.
func setWorkerReplicas(t *testing.T, cluster string, replicas *int32) {
	updateCluster(t, cluster, func(c *clusterv1.Cluster) {
		for i := range c.Spec.Topology.Workers.MachineDeployments {
			md := &c.Spec.Topology.Workers.MachineDeployments[i]
			md.Replicas = replicas
			if replicas != nil {
				delete(md.Metadata.Annotations, clusterv1.AutoscalerMinSizeAnnotation)
				delete(md.Metadata.Annotations, clusterv1.AutoscalerMaxSizeAnnotation)
			} else {
				md.Metadata.Annotations[clusterv1.AutoscalerMinSizeAnnotation] = "0"
				md.Metadata.Annotations[clusterv1.AutoscalerMaxSizeAnnotation] = "20"
			}
		}
	})
}

func setVariable(t *testing.T, cluster, variable, value string) {
	updateCluster(t, cluster, func(c *clusterv1.Cluster) {
		for i, v := range c.Spec.Topology.Variables {
			if v.Name == variable {
				c.Spec.Topology.Variables[i].Value.Raw = []byte(`"` + value + `"`)
			}
		}
	})
}

func setVersion(t *testing.T, cluster, version string) {
	updateCluster(t, cluster, func(c *clusterv1.Cluster) { c.Spec.Topology.Version = version })
}

// waitCondition waits for a NodeClass condition's status and returns its message.
func waitCondition(t *testing.T, wc *world.WorkloadCluster, nodeClass, condition, want string) string {
	t.Helper()
	var msg string
	err := e2e.WaitFor(context.Background(), time.Minute, func(ctx context.Context) (bool, error) {
		nc := &v1alpha1.ClusterAPINodeClass{}
		if err := wc.Spoke.Client.Get(ctx, client.ObjectKey{Name: nodeClass}, nc); err != nil {
			return false, err
		}
		c := nc.StatusConditions().Get(condition)
		if c == nil {
			return false, nil
		}
		msg = c.Message
		return string(c.Status) == want, nil
	})
	if err != nil {
		t.Fatalf("NodeClass %s condition %s not %s: %v (message %q)", nodeClass, condition, want, err, msg)
	}
	return msg
}

// stable checks cond at every poll for d.
func stable(t *testing.T, d time.Duration, cond func(context.Context) error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := cond(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// machineModeTemplates are the infrastructure templates the Cluster's
// standalone (Machine-mode) Machines were cloned from.
func machineModeTemplates(t *testing.T, cluster string) []string {
	t.Helper()
	machines := &clusterv1.MachineList{}
	if err := w.Hub.Client.List(context.Background(), machines, client.InNamespace(w.Namespace),
		client.MatchingLabels{clusterv1.ClusterNameLabel: cluster, v1alpha1.KarpenterMemberLabel: ""}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, m := range machines.Items {
		if m.DeletionTimestamp.IsZero() {
			seen[m.Annotations[clusterv1.TemplateClonedFromNameAnnotation]]++
		}
	}
	// The infrastructure machine carries cloned-from; the Machine may not.
	if len(seen) == 1 && seen[""] > 0 {
		seen = map[string]int{}
		for _, m := range machines.Items {
			am := &unstructured.Unstructured{}
			am.SetAPIVersion("infrastructure.cluster.x-k8s.io/v1beta2")
			am.SetKind(m.Spec.InfrastructureRef.Kind)
			if m.DeletionTimestamp.IsZero() && w.Hub.Client.Get(context.Background(), client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.InfrastructureRef.Name}, am) == nil {
				seen[am.GetAnnotations()[clusterv1.TemplateClonedFromNameAnnotation]]++
			}
		}
	}
	return sortedKeys(seen)
}

// disrupting counts a pool's NodeClaims being deleted.
func disrupting(ctx context.Context, wc *world.WorkloadCluster, pool string) (int, error) {
	ncs := &karpv1.NodeClaimList{}
	if err := wc.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
		return 0, err
	}
	n := 0
	for _, nc := range ncs.Items {
		if !nc.DeletionTimestamp.IsZero() {
			n++
		}
	}
	return n, nil
}

// noNodeAheadOfControlPlane fails when a Node's kubelet is newer than the
// version the Cluster's control plane reports running.
func noNodeAheadOfControlPlane(ctx context.Context, wc *world.WorkloadCluster, cluster string) error {
	c := &clusterv1.Cluster{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: w.Namespace, Name: cluster}, c); err != nil {
		return err
	}
	cp := &unstructured.Unstructured{}
	cp.SetAPIVersion("controlplane.cluster.x-k8s.io/v1beta2")
	cp.SetKind(c.Spec.ControlPlaneRef.Kind)
	if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: w.Namespace, Name: c.Spec.ControlPlaneRef.Name}, cp); err != nil {
		return err
	}
	running, _, _ := unstructured.NestedString(cp.Object, "status", "version")
	nodes := &corev1.NodeList{}
	if err := wc.Spoke.Client.List(ctx, nodes); err != nil {
		return err
	}
	for _, n := range nodes.Items {
		v := n.Status.NodeInfo.KubeletVersion
		if running == "" || v == "" {
			continue
		}
		nv, err1 := version.ParseGeneric(v)
		cv, err2 := version.ParseGeneric(running)
		if err1 == nil && err2 == nil && nv.GreaterThan(cv) {
			return fmt.Errorf("Node %s runs %s, newer than the control plane's %s", n.Name, v, running)
		}
	}
	return nil
}
