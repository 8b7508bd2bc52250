package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/caconvert"
	"github.com/autonode/karpenter-clusterapi/pkg/capacity"
	"github.com/autonode/karpenter-clusterapi/pkg/controllers/coexistence"
	"github.com/autonode/karpenter-clusterapi/pkg/controllers/remediation"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// convert runs the shipped binary's converter against the world.
func convert(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append([]string{caconvert.Command,
		"--cluster-api-kubeconfig=" + w.HubKubeconfig, "--namespace=" + w.Namespace, "--cluster-name=" + w.ClusterName}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %v: %v\nstdout:\n%s\nstderr:\n%s", caconvert.Command, args, err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// The walkthrough of docs/migration-from-cluster-autoscaler.md: a Cluster set
// up for cluster-autoscaler (two node groups with its size and capacity
// annotations, one scaled from zero, one with a node cluster-autoscaler
// started), the converter run as a subcommand of the provider binary, its
// output applied, and Karpenter scheduling pods on the converted node groups
// within their max-sizes: 2 + 3 replicas, one of them cluster-autoscaler's,
// so 4 nodes for 5 one-per-node pods and one pod left pending.
func TestClusterAutoscalerWalkthrough(t *testing.T) {
	ctx := context.Background()
	discovered := map[string]string{"autoscaling": "ca-walk"} // cluster-autoscaler's --node-group-auto-discovery label
	groups := []struct {
		name, instanceType, memory string
		min, max                   string
		replicas                   int32
	}{
		{"ca-walk-m5", "m5.large", "8Gi", "0", "2", 0}, // scaled from zero
		{"ca-walk-c5", "c5.large", "4Gi", "1", "3", 1}, // one node cluster-autoscaler started
	}
	var mds []*clusterv1.MachineDeployment
	for _, g := range groups {
		if _, err := w.CreateAWSMachineTemplate(ctx, g.name, g.instanceType, false); err != nil {
			t.Fatal(err)
		}
		md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
			Namespace: w.Namespace, Name: g.name, ClusterName: w.ClusterName, Labels: discovered, Replicas: g.replicas,
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
	poolName := w.ClusterName + "-ca-walk-c5"
	t.Cleanup(func() {
		_ = w.Spoke.Client.Delete(context.Background(), &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: poolName}})
		_ = w.Spoke.Client.Delete(context.Background(), &v1alpha1.ClusterAPINodeClass{ObjectMeta: metav1.ObjectMeta{Name: poolName}})
	})

	// 1. Print: the manifests and the report.
	printed := convert(t, "--selector=autoscaling=ca-walk")
	for _, want := range []string{
		"kind: NodePool", "kind: ClusterAPINodeClass", "name: " + poolName,
		"[not-carried] MachineDeployment " + w.Namespace + "/ca-walk-c5 " + caconvert.MinSizeAnnotation,
		"[todo] MachineDeployment " + w.Namespace + "/ca-walk-c5 spec.replicas",
		"consolidateAfter: 30s", "nodes: \"5\"",
	} {
		if !strings.Contains(printed, want) {
			t.Errorf("converter output lacks %q:\n%s", want, printed)
		}
	}
	// 2. Apply, twice: the second run changes nothing.
	applied := convert(t, "--selector=autoscaling=ca-walk", "--apply", "--kubeconfig="+w.SpokeKubeconfig)
	if strings.Contains(applied, " unchanged") || strings.Count(applied, "created")+strings.Count(applied, "configured") != 4 {
		t.Errorf("first --apply:\n%s", applied)
	}
	again := convert(t, "--selector=autoscaling=ca-walk", "--apply", "--kubeconfig="+w.SpokeKubeconfig)
	if strings.Count(again, " unchanged") != 4 {
		t.Errorf("second --apply changed something:\n%s", again)
	}

	// 3. Pods that select the node groups' label, one per node.
	podDeployment(t, "", "ca-walk-app", 5, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m")}, func(s *corev1.PodSpec) {
		s.NodeSelector = map[string]string{"workload": "ca-walk"}
	})
	maxes := map[string]int32{"ca-walk-m5": 2, "ca-walk-c5": 3}
	var over []string
	got := waitCounts(t, 4*time.Minute, poolName, "ca-walk-app", mds, func(c counts) bool {
		for name, r := range c.MachineDeploymentReplicas {
			if r > maxes[name] {
				over = append(over, name)
			}
		}
		return c.RunningPods == 4 && c.PendingPods == 1 && c.NodeClaims == 4 && c.Initialized == 4 &&
			c.MachineDeploymentReplicas["ca-walk-m5"] == 2 && c.MachineDeploymentReplicas["ca-walk-c5"] == 3
	})
	if len(over) > 0 {
		t.Fatalf("replicas went beyond max-size on %v", over)
	}
	t.Logf("converted node groups serve the pods within their max-sizes: %s", got)
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
