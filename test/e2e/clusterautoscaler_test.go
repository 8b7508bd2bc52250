package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/caconvert"
	"github.com/autonode/karpenter-clusterapi/pkg/capacity"
	"github.com/autonode/karpenter-clusterapi/pkg/controllers/coexistence"
	"github.com/autonode/karpenter-clusterapi/pkg/controllers/remediation"
	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// The walkthrough of docs/migration-from-cluster-autoscaler.md, from the
// doc's own commands (its blocks marked "walkthrough", in its order, every
// step of it): a Cluster set up for cluster-autoscaler (two node groups with
// its size and capacity annotations bootstrapped from a KubeadmConfigTemplate
// without Karpenter's taint, one scaled from zero, one with a node
// cluster-autoscaler started and running), converted; the node groups moved
// to a copy of the template with the taint (OnDelete: cluster-autoscaler's
// node is not replaced); the handed-over group's min-size removed; applied
// twice (once first against the wrong cluster); checked. Karpenter then
// schedules pods on the converted node groups within their max-sizes: 2 + 3
// replicas, one of them cluster-autoscaler's, so 4 Karpenter nodes and
// cluster-autoscaler's for 6 one-per-node pods, one left pending; the nodes
// Karpenter made joined with the taint and lost it at registration. Then
// cluster-autoscaler's node is moved by the doc's commands: drained, its
// Machine marked and the replicas lowered; it goes, no Karpenter Machine
// does, Karpenter launches for its pod, and the replicas are Karpenter's
// alone. Last, cluster-autoscaler, still running, scales: SoleScaler False
// within seconds, True again only after the window.
func TestClusterAutoscalerWalkthrough(t *testing.T) {
	ctx := context.Background()
	start := time.Now()
	step := func(what string) { t.Logf("%s at %s", what, time.Since(start).Round(100*time.Millisecond)) }
	discovered := map[string]string{"autoscaling": "ca-walk"} // cluster-autoscaler's --node-group-auto-discovery label
	// The node groups' bootstrap, as cluster-autoscaler needs it: no
	// Karpenter taint; the kubelet labels its nodes as the capacity
	// annotation says.
	caBootstrap := world.KubeadmConfigTemplate(w.Namespace, "ca-walk", map[string]string{"node-labels": "workload=ca-walk"})
	caBootstrap.Spec.Template.Spec.JoinConfiguration.NodeRegistration.Taints = nil
	if err := w.Hub.Client.Create(ctx, caBootstrap); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, name := range []string{"ca-walk", "ca-walk-karpenter"} {
			_ = w.Hub.Client.Delete(context.Background(), &bootstrapv1.KubeadmConfigTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: w.Namespace, Name: name}})
		}
	})
	groups := []struct {
		name, instanceType, memory string
		min, max, price            string
		replicas                   int32
	}{
		{"ca-walk-m5", "m5.large", "8Gi", "0", "2", "0.096", 0}, // scaled from zero
		{"ca-walk-c5", "c5.large", "4Gi", "1", "3", "0.085", 1}, // one node cluster-autoscaler started
	}
	var mds []*clusterv1.MachineDeployment
	for _, g := range groups {
		if _, err := w.CreateAWSMachineTemplate(ctx, g.name, g.instanceType, false); err != nil {
			t.Fatal(err)
		}
		md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
			Namespace: w.Namespace, Name: g.name, ClusterName: w.ClusterName, Labels: discovered, Replicas: g.replicas,
			BootstrapTemplate: caBootstrap.Name,
			Annotations: map[string]string{
				caconvert.MinSizeAnnotation: g.min, caconvert.MaxSizeAnnotation: g.max,
				capacity.CPUKey: "2", capacity.MemoryKey: g.memory,
				capacity.LabelsKey: "node.kubernetes.io/instance-type=" + g.instanceType + ",workload=ca-walk",
				caconvert.OptionsPrefix + "scaledownunneededtime": "30s",
			},
		})
		if err := w.Hub.Client.Create(ctx, md); err != nil {
			t.Fatal(err)
		}
		mds = append(mds, md)
		t.Cleanup(func() { _ = w.Hub.Client.Delete(context.Background(), md) })
	}
	// cluster-autoscaler's replica has its Machine (on the first
	// MachineSet, from the template without the taint).
	caMachine := onlyMachine(t, mds[1])
	poolName := w.ClusterName + "-ca-walk-c5"
	t.Cleanup(func() {
		_ = w.Spoke.Client.Delete(context.Background(), &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: poolName}})
		_ = w.Spoke.Client.Delete(context.Background(), &v1alpha1.ClusterAPINodeClass{ObjectMeta: metav1.ObjectMeta{Name: poolName}})
	})
	doc := newWalkthrough(t, "../../docs/migration-from-cluster-autoscaler.md", map[string]string{
		"MGMT": w.HubKubeconfig, "WORKLOAD": w.SpokeKubeconfig, "NAMESPACE": w.Namespace, "CLUSTER": w.ClusterName,
		"SELECTOR": "autoscaling=ca-walk", "NODE_GROUP": "ca-walk-c5", "PRICE": "0.085",
	})
	if want := []string{"convert", "join with the taint", "stop cluster-autoscaler", "apply", "check",
		"find cluster-autoscaler's nodes", "move cluster-autoscaler's nodes"}; strings.Join(doc.order, ",") != strings.Join(want, ",") {
		t.Fatalf("the doc's walkthrough blocks are %v, want %v", doc.order, want)
	}

	// 1. Convert: the manifests and the report, in converted.yaml.
	doc.must(t, "convert")
	step("1 converted")
	raw, err := os.ReadFile(filepath.Join(doc.dir, "converted.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	printed := string(raw)
	for _, want := range []string{
		"kind: NodePool", "kind: ClusterAPINodeClass", "name: " + poolName,
		"[todo] MachineDeployment " + w.Namespace + "/ca-walk-c5 " + caconvert.MinSizeAnnotation + ": 1 kept",
		"[todo] MachineDeployment " + w.Namespace + "/ca-walk-c5 spec.replicas: its 1 running replicas were started by cluster-autoscaler",
		"consolidateAfter: 30s", "nodes: \"5\"",
	} {
		if !strings.Contains(printed, want) {
			t.Errorf("converter output lacks %q:\n%s", want, printed)
		}
	}
	if strings.Contains(printed, "[not-carried] MachineSet") {
		t.Errorf("a MachineSet max-size line:\n%s", printed)
	}
	// 2. New nodes join with the taint: both node groups the apply converts
	// (the second with the doc's settings for it) on the template's copy.
	doc.must(t, "join with the taint")
	if out, err := doc.run(t, "join with the taint", "NODE_GROUP=ca-walk-m5", "PRICE=0.096"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	joinsTainted(t, mds, groups[0].price, groups[1].price)
	step("2 joined with the taint")
	// 3. Stop cluster-autoscaler: min-size removed.
	doc.must(t, "stop cluster-autoscaler")
	// 4. Apply, first against the wrong cluster (the management cluster's
	// kubeconfig as the workload's): refused, naming both, nothing written.
	out, err := doc.run(t, "apply", "WORKLOAD="+w.HubKubeconfig)
	if err == nil || !strings.Contains(out, "is not the workload cluster of Cluster "+w.Namespace+"/"+w.ClusterName) || !strings.Contains(out, w.Hub.Config.Host) {
		t.Errorf("--apply against the management cluster: %v\n%s", err, out)
	}
	for _, md := range mds {
		cur := &clusterv1.MachineDeployment{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
			t.Fatal(err)
		}
		if _, ok := cur.Labels[v1alpha1.KarpenterMemberLabel]; ok {
			t.Errorf("the refused --apply labelled %s", md.Name)
		}
	}
	if err := w.Spoke.Client.Get(ctx, clientKey(poolName), &karpv1.NodePool{}); err == nil {
		t.Errorf("the refused --apply wrote NodePool %s", poolName)
	}
	// Then as written, twice: the second run changes nothing.
	applied := doc.must(t, "apply")
	if strings.Contains(applied, " unchanged") || strings.Count(applied, " created")+strings.Count(applied, " configured") != 4 {
		t.Errorf("first --apply:\n%s", applied)
	}
	if !strings.Contains(applied, "[mapped] MachineDeployment "+w.Namespace+"/ca-walk-c5 "+caconvert.MinSizeAnnotation+": removed (--assume-node-group)") {
		t.Errorf("first --apply does not report the min-size removed on purpose:\n%s", applied)
	}
	again := doc.must(t, "apply")
	if strings.Count(again, " unchanged") != 4 || strings.Contains(again, " created") || strings.Contains(again, " configured") {
		t.Errorf("second --apply changed something:\n%s", again)
	}
	// 5. Check: Ready, SoleScaler True.
	doc.must(t, "check")
	step("5 checked")

	caNode := caStartedNode(t, caMachine)
	step("cluster-autoscaler's node runs")
	// Pods that select the node groups' label, one per node: one runs on
	// cluster-autoscaler's node, four on Karpenter's, one stays pending.
	podDeployment(t, "", "ca-walk-app", 6, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m")}, func(s *corev1.PodSpec) {
		s.NodeSelector = map[string]string{"workload": "ca-walk"}
	})
	maxes := map[string]int32{"ca-walk-m5": 2, "ca-walk-c5": 3}
	var over []string
	within := func(c counts) bool {
		for name, r := range c.MachineDeploymentReplicas {
			if r > maxes[name] {
				over = append(over, name)
			}
		}
		return len(over) == 0
	}
	got := waitCounts(t, 4*time.Minute, poolName, "ca-walk-app", mds, func(c counts) bool {
		return within(c) && c.RunningPods == 5 && c.PendingPods == 1 && c.NodeClaims == 4 && c.Initialized == 4 &&
			c.BoundMachines == 4 && c.UnboundMachines == 1 && c.MachineDeploymentReplicas["ca-walk-m5"] == 2 && c.MachineDeploymentReplicas["ca-walk-c5"] == 3
	})
	if len(over) > 0 {
		t.Fatalf("replicas went beyond max-size on %v", over)
	}
	t.Logf("converted node groups serve the pods within their max-sizes: %s", got)
	karpenters := karpenterMachinesJoinedTainted(t, mds)
	step("Karpenter's nodes run")

	// 6. Move cluster-autoscaler's node: the one it started, never replaced.
	found := doc.must(t, "find cluster-autoscaler's nodes")
	if want := caMachine + " " + caNode + "\n3 replicas, 2 of them Karpenter's\n"; found != want {
		t.Fatalf("the doc's listing of cluster-autoscaler's nodes printed\n%s\nwant\n%s", found, want)
	}
	doc.must(t, "move cluster-autoscaler's nodes")
	step("6 moved")
	got = waitCounts(t, 2*time.Minute, poolName, "ca-walk-app", mds, func(c counts) bool {
		return within(c) && c.RunningPods == 5 && c.PendingPods == 1 && c.NodeClaims == 5 && c.Initialized == 5 &&
			c.Machines == 5 && c.BoundMachines == 5 && c.MachineDeploymentReplicas["ca-walk-m5"] == 2 && c.MachineDeploymentReplicas["ca-walk-c5"] == 3 &&
			!machineExists(t, &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: w.Namespace, Name: caMachine}}) &&
			apierrors.IsNotFound(w.Spoke.Client.Get(ctx, clientKey(caNode), &corev1.Node{}))
	})
	if len(over) > 0 {
		t.Fatalf("replicas went beyond max-size on %v", over)
	}
	for _, m := range karpenters {
		if !machineExists(t, &m) {
			t.Errorf("Karpenter's Machine %s (NodeClaim %s) was deleted", m.Name, m.Annotations[v1alpha1.NodeClaimAnnotation])
		}
	}
	for _, md := range mds {
		cur := &clusterv1.MachineDeployment{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
			t.Fatal(err)
		}
		if owned := cur.Annotations["karpenter.cluster.x-k8s.io/owned-replicas"]; owned != strconv.Itoa(int(*cur.Spec.Replicas)) {
			t.Errorf("%s: %d replicas, Karpenter's %q", md.Name, *cur.Spec.Replicas, owned)
		}
	}
	if c := soleScaler(t, poolName); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("SoleScaler after the doc's lowering: %+v", c)
	}
	t.Logf("cluster-autoscaler's node %s moved; the replicas are Karpenter's: %s", caNode, got)
	step("6 done")

	caStillWrites(t, mds[1], poolName)
	// The pending pod stays pending: both node groups are at their max-size.
	for _, md := range mds {
		cur := &clusterv1.MachineDeployment{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
			t.Fatal(err)
		}
		if *cur.Spec.Replicas > maxes[md.Name] {
			t.Fatalf("%s: %d replicas, max-size %d", md.Name, *cur.Spec.Replicas, maxes[md.Name])
		}
	}
}

// onlyMachine waits for md's one Machine, counted in md's status (so Cluster
// API's MachineDeployment controller has seen it: a template change now
// keeps it on its MachineSet, as for a node that has run for long), and
// returns its name.
func onlyMachine(t *testing.T, md *clusterv1.MachineDeployment) string {
	t.Helper()
	var name string
	if err := WaitFor(context.Background(), time.Minute, func(ctx context.Context) (bool, error) {
		machines := &clusterv1.MachineList{}
		if err := w.Hub.Client.List(ctx, machines, client.InNamespace(md.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
			return false, err
		}
		cur := &clusterv1.MachineDeployment{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
			return false, err
		}
		if len(machines.Items) == 1 {
			name = machines.Items[0].Name
		}
		return len(machines.Items) == 1 && cur.Status.Replicas != nil && *cur.Status.Replicas == 1, nil
	}); err != nil {
		t.Fatalf("no Machine of %s: %v", md.Name, err)
	}
	return name
}

// caStartedNode waits for cluster-autoscaler's Machine to run a Ready Node
// without Karpenter's taint, labelled as its node group, and returns its name.
func caStartedNode(t *testing.T, machine string) string {
	t.Helper()
	var node, last string
	if err := WaitFor(context.Background(), 2*time.Minute, func(ctx context.Context) (bool, error) {
		m := &clusterv1.Machine{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: w.Namespace, Name: machine}, m); err != nil || m.Status.NodeRef.Name == "" {
			last = fmt.Sprintf("Machine phase %q, deleting %v, no nodeRef", m.Status.Phase, !m.DeletionTimestamp.IsZero())
			return false, err
		}
		n := &corev1.Node{}
		if err := w.Spoke.Client.Get(ctx, clientKey(m.Status.NodeRef.Name), n); err != nil {
			last = "Node " + m.Status.NodeRef.Name + " not found"
			return false, client.IgnoreNotFound(err)
		}
		last = fmt.Sprintf("Node %s: labels %v, conditions %v", n.Name, n.Labels, n.Status.Conditions)
		for _, taint := range n.Spec.Taints {
			if taint.MatchTaint(&world.UnregisteredTaint) {
				return false, fmt.Errorf("cluster-autoscaler's node %s has %s", n.Name, taint.ToString())
			}
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && n.Labels["workload"] == "ca-walk" {
				node = n.Name
			}
		}
		return node != "", nil
	}); err != nil {
		t.Fatalf("cluster-autoscaler's Machine %s runs no node: %v; last: %s", machine, err, last)
	}
	return node
}

// joinsTainted: after step 2 each MachineDeployment bootstraps new Machines
// from a copy of its KubeadmConfigTemplate whose join taints add Karpenter's,
// with the rollout strategy OnDelete and its price; the original template
// is unchanged.
func joinsTainted(t *testing.T, mds []*clusterv1.MachineDeployment, prices ...string) {
	t.Helper()
	ctx := context.Background()
	for i, md := range mds {
		cur := &clusterv1.MachineDeployment{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
			t.Fatal(err)
		}
		ref := cur.Spec.Template.Spec.Bootstrap.ConfigRef
		if ref.Kind != world.KubeadmConfigTemplateKind || ref.Name != "ca-walk-karpenter" {
			t.Errorf("%s bootstraps from %s %s, want KubeadmConfigTemplate ca-walk-karpenter", md.Name, ref.Kind, ref.Name)
		}
		if cur.Spec.Rollout.Strategy.Type != clusterv1.OnDeleteMachineDeploymentStrategyType {
			t.Errorf("%s: rollout strategy %q, want OnDelete", md.Name, cur.Spec.Rollout.Strategy.Type)
		}
		if p := cur.Annotations[v1alpha1.PriceAnnotation]; p != prices[i] {
			t.Errorf("%s: price %q, want %q", md.Name, p, prices[i])
		}
	}
	for name, want := range map[string][]corev1.Taint{"ca-walk": nil, "ca-walk-karpenter": {world.UnregisteredTaint}} {
		tmpl := &bootstrapv1.KubeadmConfigTemplate{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: w.Namespace, Name: name}, tmpl); err != nil {
			t.Fatal(err)
		}
		d := world.BootstrapDataOf(tmpl.Spec.Template.Spec)
		if !equality.Semantic.DeepEqual(d.Taints, want) || d.Labels["workload"] != "ca-walk" {
			t.Errorf("KubeadmConfigTemplate %s joins with taints %v and labels %v, want taints %v and workload=ca-walk", name, d.Taints, d.Labels, want)
		}
	}
}

// karpenterMachinesJoinedTainted returns the Machines bound to NodeClaims of
// mds, after checking that each was bootstrapped from a KubeadmConfig with
// Karpenter's taint and that its Node no longer has it (Karpenter registered
// it).
func karpenterMachinesJoinedTainted(t *testing.T, mds []*clusterv1.MachineDeployment) []clusterv1.Machine {
	t.Helper()
	ctx := context.Background()
	var out []clusterv1.Machine
	// Cluster API links a Machine to its Node on its own schedule.
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		out = nil
		for _, md := range mds {
			machines := &clusterv1.MachineList{}
			if err := w.Hub.Client.List(ctx, machines, client.InNamespace(md.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
				return false, err
			}
			for _, m := range machines.Items {
				if m.Annotations[v1alpha1.NodeClaimAnnotation] == "" {
					continue
				}
				if m.Status.NodeRef.Name == "" {
					return false, nil
				}
				out = append(out, m)
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("Karpenter's Machines not linked to their Nodes: %v", err)
	}
	for _, m := range out {
		cfg := &bootstrapv1.KubeadmConfig{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.Bootstrap.ConfigRef.Name}, cfg); err != nil {
			t.Fatalf("Machine %s: its KubeadmConfig: %v", m.Name, err)
		}
		if d := world.BootstrapDataOf(cfg.Spec); !equality.Semantic.DeepEqual(d.Taints, []corev1.Taint{world.UnregisteredTaint}) {
			t.Errorf("Karpenter's Machine %s joined with taints %v, want %s", m.Name, d.Taints, world.UnregisteredTaint.ToString())
		}
		n := &corev1.Node{}
		if err := w.Spoke.Client.Get(ctx, clientKey(m.Status.NodeRef.Name), n); err != nil {
			t.Fatalf("Machine %s: its Node: %v", m.Name, err)
		}
		for _, taint := range n.Spec.Taints {
			if taint.MatchTaint(&world.UnregisteredTaint) {
				t.Errorf("Karpenter's Node %s still has %s", n.Name, taint.ToString())
			}
		}
	}
	if len(out) != 4 {
		t.Fatalf("%d Machines bound to NodeClaims, want 4", len(out))
	}
	return out
}

// soleScaler returns the NodeClass's SoleScaler condition (nil when unset).
func soleScaler(t *testing.T, nodeClass string) *metav1.Condition {
	t.Helper()
	nc := &v1alpha1.ClusterAPINodeClass{}
	if err := w.Spoke.Client.Get(context.Background(), clientKey(nodeClass), nc); err != nil {
		t.Fatal(err)
	}
	c := nc.StatusConditions().Get(coexistence.ConditionTypeSoleScaler)
	if c == nil {
		return nil
	}
	return &metav1.Condition{Status: c.Status, Reason: c.Reason, Message: c.Message}
}

// caStillWrites: cluster-autoscaler, still running, lowers md through its
// scale subresource: SoleScaler turns False within seconds and stays False
// until suiteSoleScalerWindow has passed since, then turns True.
func caStillWrites(t *testing.T, md *clusterv1.MachineDeployment, nodeClass string) {
	ctx := context.Background()
	cfg := rest.CopyConfig(w.Hub.Config)
	cfg.UserAgent = "cluster-autoscaler/v1.33.0"
	autoscaler, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	cur := &clusterv1.MachineDeployment{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
		t.Fatal(err)
	}
	if err := autoscaler.SubResource("scale").Update(ctx, cur, client.WithSubResourceBody(&autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: *cur.Spec.Replicas - 1}})); err != nil {
		t.Fatal(err)
	}
	wrote := time.Now()
	sole := func(ctx context.Context) (*metav1.Condition, error) {
		nc := &v1alpha1.ClusterAPINodeClass{}
		if err := w.Spoke.Client.Get(ctx, clientKey(nodeClass), nc); err != nil {
			return nil, err
		}
		c := nc.StatusConditions().Get(coexistence.ConditionTypeSoleScaler)
		if c == nil {
			return nil, nil
		}
		return &metav1.Condition{Status: c.Status, Reason: c.Reason, Message: c.Message}, nil
	}
	if err := WaitFor(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
		c, err := sole(ctx)
		return c != nil && c.Status == metav1.ConditionFalse, err
	}); err != nil {
		t.Fatalf("SoleScaler not False within 30 s of cluster-autoscaler's write: %v", err)
	}
	t.Logf("SoleScaler False %s after cluster-autoscaler's write", time.Since(wrote).Round(time.Second))
	var trueAt time.Time
	if err := WaitFor(ctx, suiteSoleScalerWindow+time.Minute, func(ctx context.Context) (bool, error) {
		c, err := sole(ctx)
		if c != nil && c.Status == metav1.ConditionTrue {
			trueAt = time.Now()
			return true, nil
		}
		return false, err
	}); err != nil {
		t.Fatalf("SoleScaler not True again within the window (%s) and a minute: %v", suiteSoleScalerWindow, err)
	}
	if after := trueAt.Sub(wrote); after < suiteSoleScalerWindow {
		t.Errorf("SoleScaler True %s after cluster-autoscaler's write, before the window (%s)", after.Round(time.Second), suiteSoleScalerWindow)
	}
	t.Logf("SoleScaler True again %s after cluster-autoscaler's write (window %s)", trueAt.Sub(wrote).Round(time.Second), suiteSoleScalerWindow)
}

// cluster-autoscaler still running scales a MachineDeployment Karpenter
// scales (its scale subresource, as it does): the NodeClass's SoleScaler
// condition and a Warning event on the MachineDeployment say so.
func TestClusterAutoscalerCoexistenceReported(t *testing.T) {
	ctx := context.Background()
	pool(t, "coexist")
	md := machineDeployment(t, "coexist", "coexist-m5", "m5.large", "", map[string]string{
		v1alpha1.PriceAnnotation: "0.096", caconvert.MinSizeAnnotation: "0", caconvert.MaxSizeAnnotation: "3",
	})
	t.Cleanup(func() { _ = w.Hub.Client.Delete(context.Background(), md) })
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		nc := &v1alpha1.ClusterAPINodeClass{}
		if err := w.Spoke.Client.Get(ctx, clientKey("coexist"), nc); err != nil {
			return false, err
		}
		return nc.StatusConditions().Get(coexistence.ConditionTypeSoleScaler).IsTrue(), nil
	}); err != nil {
		t.Fatalf("SoleScaler not True before anyone else scaled: %v", err)
	}

	cfg := rest.CopyConfig(w.Hub.Config)
	cfg.UserAgent = "cluster-autoscaler/v1.33.0"
	autoscaler, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	cur := &clusterv1.MachineDeployment{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
		t.Fatal(err)
	}
	if err := autoscaler.SubResource("scale").Update(ctx, cur, client.WithSubResourceBody(&autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: 1}})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		back := &clusterv1.MachineDeployment{}
		if err := w.Hub.Client.Get(context.Background(), client.ObjectKeyFromObject(md), back); err == nil {
			_ = autoscaler.SubResource("scale").Update(context.Background(), back, client.WithSubResourceBody(&autoscalingv1.Scale{Spec: autoscalingv1.ScaleSpec{Replicas: 0}}))
		}
	})
	var message string
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		nc := &v1alpha1.ClusterAPINodeClass{}
		if err := w.Spoke.Client.Get(ctx, clientKey("coexist"), nc); err != nil {
			return false, err
		}
		c := nc.StatusConditions().Get(coexistence.ConditionTypeSoleScaler)
		if c == nil || !c.IsFalse() {
			return false, nil
		}
		message = c.Message
		return c.Reason == coexistence.ReasonScaledByAnotherAutoscaler, nil
	}); err != nil {
		t.Fatalf("the NodeClass does not report cluster-autoscaler: %v", err)
	}
	if !strings.Contains(message, "MachineDeployment "+w.Namespace+"/coexist-m5") || !strings.Contains(message, "cluster-autoscaler (scale subresource)") {
		t.Errorf("SoleScaler message %q: want the MachineDeployment and the writer", message)
	}
	if err := WaitFor(ctx, time.Minute, func(context.Context) (bool, error) {
		return mdEvents(t, md, coexistence.ReasonReplicasChangedByAnotherWriter) > 0, nil
	}); err != nil {
		t.Fatalf("no %s event on the MachineDeployment: %v", coexistence.ReasonReplicasChangedByAnotherWriter, err)
	}
	t.Logf("reported: %s", message)
}

// A MachineHealthCheck selects Karpenter's Machines while Karpenter's node
// repair is on: one unhealthy node must be replaced once, by one of them.
// The MachineHealthCheck reacts after 2 s, node repair after 20 s: without
// skip-remediation the MachineHealthCheck deletes the Machine, its
// MachineSet makes a replacement, and Karpenter launches one more for the
// pods (two new Machines). With it, node repair alone replaces the node.
func TestOneRemediationAtATime(t *testing.T) {
	ctx := context.Background()
	provider.Stop()
	repairing, err := StartProviderWithEnv(bin, w, "remediation.log", []string{
		"FEATURE_GATES=NodeOverlay=true,NodeRepair=true",
		"REPAIR_CONDITIONS=E2EUnhealthy=True:20s",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpTail(repairing.LogPath, 80)
		}
		repairing.Stop()
		if provider, err = StartProvider(bin, w, "provider.log"); err != nil {
			t.Errorf("restarting the suite's provider: %v", err)
		}
	})
	pool(t, "remedy")
	md := machineDeployment(t, "remedy", "remedy-m5", "m5.large", "", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	t.Cleanup(func() { _ = w.Hub.Client.Delete(context.Background(), md) })
	mds := []*clusterv1.MachineDeployment{md}
	deployment(t, "remedy", "remedy-app", 2, "1500m")
	waitCounts(t, 3*time.Minute, "remedy", "remedy-app", mds, func(c counts) bool {
		return c.RunningPods == 2 && c.Initialized == 2 && c.BoundMachines == 2 && c.Machines == 2
	})

	// Karpenter's Machines are left to node repair (and Cluster API has
	// linked them to their Nodes).
	machines := &clusterv1.MachineList{}
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		if err := w.Hub.Client.List(ctx, machines, client.InNamespace(w.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
			return false, err
		}
		for _, m := range machines.Items {
			if _, ok := m.Annotations[clusterv1.MachineSkipRemediationAnnotation]; !ok || m.Annotations[remediation.SetByProviderAnnotation] == "" || m.Status.NodeRef.Name == "" {
				return false, nil
			}
		}
		return len(machines.Items) == 2, nil
	}); err != nil {
		t.Fatalf("Karpenter's Machines lack %s: %v", clusterv1.MachineSkipRemediationAnnotation, err)
	}

	mhc := &clusterv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.Namespace, Name: "remedy"},
		Spec: clusterv1.MachineHealthCheckSpec{
			ClusterName: w.ClusterName,
			Selector:    metav1.LabelSelector{MatchLabels: map[string]string{clusterv1.MachineDeploymentNameLabel: md.Name}},
			Checks: clusterv1.MachineHealthCheckChecks{UnhealthyNodeConditions: []clusterv1.UnhealthyNodeCondition{
				{Type: "E2EUnhealthy", Status: corev1.ConditionTrue, TimeoutSeconds: ptrTo(int32(2))},
			}},
		},
	}
	if err := w.Hub.Client.Create(ctx, mhc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Hub.Client.Delete(context.Background(), mhc) })

	// Every Machine of the MachineDeployment made from now on.
	hubCache, _ := worldCaches(t)
	before := map[string]bool{}
	for _, m := range machines.Items {
		before[m.Name] = true
	}
	var mu sync.Mutex
	made := map[string]bool{}
	inf, err := hubCache.GetInformer(ctx, &clusterv1.Machine{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: func(o any) {
		if m, ok := o.(*clusterv1.Machine); ok && m.Labels[clusterv1.MachineDeploymentNameLabel] == md.Name && !before[m.Name] {
			mu.Lock()
			made[m.Name] = true
			mu.Unlock()
		}
	}}); err != nil {
		t.Fatal(err)
	}
	cacheCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = hubCache.Start(cacheCtx) }()
	hubCache.WaitForCacheSync(cacheCtx)

	// One node turns unhealthy.
	sick := machines.Items[0]
	if sick.Status.NodeRef.Name == "" {
		t.Fatalf("Machine %s has no Node", sick.Name)
	}
	node := &corev1.Node{}
	if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: sick.Status.NodeRef.Name}, node); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(node.DeepCopy())
	node.Status.Conditions = append(node.Status.Conditions, corev1.NodeCondition{
		Type: "E2EUnhealthy", Status: corev1.ConditionTrue, Reason: "Injected", Message: "the test made this node unhealthy",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
	})
	if err := w.Spoke.Client.Status().Patch(ctx, node, patch); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got := waitCounts(t, 4*time.Minute, "remedy", "remedy-app", mds, func(c counts) bool {
		return c.RunningPods == 2 && c.Initialized == 2 && c.Machines == 2 && c.BoundMachines == 2 && c.Replicas == 2 && !machineExists(t, &sick)
	})
	mu.Lock()
	n := len(made)
	mu.Unlock()
	if n != 1 {
		t.Fatalf("the unhealthy node was replaced by %d new Machines (%v), want exactly 1; %s", n, made, got)
	}
	t.Logf("unhealthy node %s replaced once, by Karpenter's node repair, in %s: %s", node.Name, time.Since(start).Round(time.Second), got)
}

func ptrTo[T any](v T) *T { return &v }
