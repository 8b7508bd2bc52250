package world_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

func TestMain(m *testing.M) {
	world.RunSideIfAsked() // TestSplitWorld's side processes
	// Keep controller-runtime's global logger quiet; the world logs to files.
	ctrl.SetLogger(zap.New(zap.WriteTo(discard{})))
	klog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func startWorld(t *testing.T) *world.World {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	w, err := world.Start(ctx, world.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("world started in %s (dir %s)", time.Since(start).Round(100*time.Millisecond), w.Dir)
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("WORLD_KEEP_DIR") != "" {
			w.KeepDir = true
			t.Logf("world logs: %s", strings.Join(w.LogFiles(), " "))
		}
		stopStart := time.Now()
		if err := w.Stop(); err != nil {
			t.Errorf("stopping world: %v", err)
		}
		t.Logf("world stopped in %s", time.Since(stopStart).Round(100*time.Millisecond))
	})
	return w
}

// TestWorld proves the world works end to end. One world serves the subtests
// (a start costs several seconds); they use separate MachineDeployments.
func TestWorld(t *testing.T) {
	w := startWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 7*time.Minute)
	defer cancel()
	if _, err := w.CreateAWSMachineTemplate(ctx, "m5-large", "m5.large", false); err != nil {
		t.Fatal(err)
	}
	t.Run("MachineDeploymentScaleUpRunPodsScaleDown", func(t *testing.T) { testLifecycle(ctx, t, w) })
	t.Run("InsufficientCapacity", func(t *testing.T) { testInsufficientCapacity(ctx, t, w) })
	t.Run("InstanceTerminatedBehindCAPIsBack", func(t *testing.T) { testTerminateInstance(ctx, t, w) })
	t.Run("KubeadmBootstrapProvider", func(t *testing.T) { testKubeadmBootstrap(ctx, t, w) })
	t.Run("HubAPIServerOutage", func(t *testing.T) { testHubOutage(ctx, t, w) })
	t.Run("SecondCluster", func(t *testing.T) { testSecondCluster(ctx, t, w) })
	t.Run("NodeReadyDelay", func(t *testing.T) { testNodeReadyDelay(ctx, t, w) })
	t.Run("SpokeAuditLogsNodeClaimStatusWrites", func(t *testing.T) { testSpokeAudit(ctx, t, w) })
}

// testNodeReadyDelay: with a NodeReadyDelay a registered Node reports
// NotReady, as a kubelet whose network plugin has not started does, and
// keeps the not-ready taint (no Pod is scheduled there) for that long, then
// turns Ready; with an ImagePullDelay its first Pod of an image waits for
// the pull.
func testNodeReadyDelay(ctx context.Context, t *testing.T, w *world.World) {
	hub, spoke := w.Hub.Client, w.Spoke.Client
	const delay = 8 * time.Second
	w.SetNodeReadyDelay(delay)
	defer w.SetNodeReadyDelay(0)
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: w.Namespace, Name: "md-ready-delay", ClusterName: w.ClusterName, InfraTemplate: "m5-large", Replicas: 1,
	})
	if err := hub.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	var node corev1.Node
	waitFor(ctx, t, 60*time.Second, "a registered Node", func(ctx context.Context) (bool, string, error) {
		ns, err := simulatedNodes(ctx, spoke)
		if err != nil || len(ns) != 1 {
			return false, fmt.Sprintf("%d Nodes", len(ns)), err
		}
		node = ns[0]
		return len(node.Status.Conditions) > 0, "no conditions yet", nil
	})
	if young := time.Since(node.CreationTimestamp.Time); young < delay-2*time.Second {
		var ready *corev1.NodeCondition
		for i := range node.Status.Conditions {
			if node.Status.Conditions[i].Type == corev1.NodeReady {
				ready = &node.Status.Conditions[i]
			}
		}
		if ready == nil || ready.Status != corev1.ConditionFalse || ready.Reason != "KubeletNotReady" {
			t.Errorf("Node %s %s after registering: Ready condition %+v, want False (KubeletNotReady)", node.Name, young, ready)
		}
		if !hasTaint(&node, corev1.TaintNodeNotReady) {
			t.Errorf("Node %s NotReady without the %s taint: %v", node.Name, corev1.TaintNodeNotReady, node.Spec.Taints)
		}
	} else {
		t.Fatalf("first saw Node %s %s after it registered: too late to see it NotReady", node.Name, young)
	}
	waitFor(ctx, t, 60*time.Second, "the Node Ready", func(ctx context.Context) (bool, string, error) {
		if err := spoke.Get(ctx, client.ObjectKeyFromObject(&node), &node); err != nil {
			return false, "", err
		}
		return nodeReady(&node) && !hasTaint(&node, corev1.TaintNodeNotReady), fmt.Sprintf("conditions %v, taints %v", node.Status.Conditions, node.Spec.Taints), nil
	})
	for _, c := range node.Status.Conditions {
		// Times have a second's resolution.
		if c.Type == corev1.NodeReady && c.LastTransitionTime.Sub(node.CreationTimestamp.Time) < delay-time.Second {
			t.Errorf("Node %s Ready %s after registering, want %s", node.Name, c.LastTransitionTime.Sub(node.CreationTimestamp.Time), delay)
		}
	}
	// With an ImagePullDelay the Node's first Pod of an image starts once
	// the image is pulled; the next Pod of that image starts at once.
	const pull = 4 * time.Second
	w.SetImagePullDelay(pull)
	defer w.SetImagePullDelay(0)
	start := func(name string) time.Duration {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.PodSpec{NodeName: node.Name,
				Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}}},
		}
		if err := spoke.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		waitFor(ctx, t, 60*time.Second, "Pod "+name+" running", func(ctx context.Context) (bool, string, error) {
			if err := spoke.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
				return false, "", err
			}
			return pod.Status.Phase == corev1.PodRunning, string(pod.Status.Phase), nil
		})
		if err := spoke.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil {
			t.Error(err)
		}
		return pod.Status.StartTime.Sub(pod.CreationTimestamp.Time)
	}
	// Times have a second's resolution.
	if took := start("first-of-its-image"); took < pull-time.Second {
		t.Errorf("the Node's first Pod of an image started %s after it was created, want the pull's %s", took, pull)
	}
	if took := start("second-of-its-image"); took >= pull-time.Second {
		t.Errorf("a Pod whose image the Node has started %s after it was created: pulled again", took)
	}
	if err := hub.Delete(ctx, md); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 90*time.Second, "the Node gone", func(ctx context.Context) (bool, string, error) {
		ns, err := simulatedNodes(ctx, spoke)
		return len(ns) == 0, fmt.Sprintf("%d Nodes", len(ns)), err
	})
}

func testTerminateInstance(ctx context.Context, t *testing.T, w *world.World) {
	hub, spoke := w.Hub.Client, w.Spoke.Client
	tmpl := world.AWSMachineTemplate(w.Namespace, "m6g-large-spot", "m6g.large", true)
	tmpl.Status = infrav1.AWSMachineTemplateStatus{} // left for the simulated AWS to fill
	if err := hub.Create(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: w.Namespace, Name: "md-spot", ClusterName: w.ClusterName, InfraTemplate: tmpl.Name, Replicas: 1,
	})
	if err := hub.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	var node corev1.Node
	waitFor(ctx, t, 60*time.Second, "a Ready spot Node", func(ctx context.Context) (bool, string, error) {
		ns, err := simulatedNodes(ctx, spoke)
		if err != nil || len(ns) != 1 {
			return false, fmt.Sprintf("%d Nodes", len(ns)), err
		}
		node = ns[0]
		return nodeReady(&node), "not ready", nil
	})
	// Without a zone on the MachineDeployment the first zone is used; the
	// simulated AWS filled the template's status like CAPA does once the
	// MachineDeployment made the Cluster its owner.
	if node.Labels[corev1.LabelTopologyZone] != "us-east-1a" || node.Labels[corev1.LabelArchStable] != "arm64" {
		t.Errorf("Node labels %v", node.Labels)
	}
	if err := hub.Get(ctx, client.ObjectKeyFromObject(tmpl), tmpl); err != nil {
		t.Fatal(err)
	}
	if mem := tmpl.Status.Capacity[corev1.ResourceMemory]; mem.Cmp(resource.MustParse("8Gi")) != 0 || tmpl.Status.NodeInfo == nil || tmpl.Status.NodeInfo.Architecture != infrav1.ArchitectureArm64 {
		t.Errorf("template status %+v", tmpl.Status)
	}
	instances := w.AWS.Instances()
	if len(instances) != 1 || instances[0].CapacityType != world.CapacityTypeSpot || instances[0].Type != "m6g.large" {
		t.Fatalf("instances %+v", instances)
	}
	if err := w.AWS.TerminateInstance(instances[0].ID); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 60*time.Second, "the Node gone and the Machine failed", func(ctx context.Context) (bool, string, error) {
		ns, err := simulatedNodes(ctx, spoke)
		if err != nil {
			return false, "", err
		}
		ms, err := machinesOf(ctx, hub, w.Namespace, "md-spot")
		if err != nil || len(ms) != 1 {
			return false, fmt.Sprintf("%d Machines", len(ms)), err
		}
		d := ms[0].Status.Deprecated
		failed := d != nil && d.V1Beta1 != nil && d.V1Beta1.FailureReason != nil && string(*d.V1Beta1.FailureReason) == "UpdateError"
		return len(ns) == 0 && failed, fmt.Sprintf("%d Nodes, %s", len(ns), describeMachines(ms)), nil
	})
	if err := hub.Delete(ctx, md); err != nil {
		t.Error(err)
	}
}

func testLifecycle(ctx context.Context, t *testing.T, w *world.World) {
	hub, spoke := w.Hub.Client, w.Spoke.Client
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: w.Namespace, Name: "md-a", ClusterName: w.ClusterName,
		InfraTemplate: "m5-large", Replicas: 3, FailureDomain: "us-east-1a",
	})
	start := time.Now()
	if err := hub.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	// The real defaulting webhook ran.
	if md.Spec.Rollout.Strategy.Type != clusterv1.RollingUpdateMachineDeploymentStrategyType {
		t.Fatalf("MachineDeployment not defaulted by Cluster API's webhook: %+v", md.Spec.Rollout)
	}

	var machines []clusterv1.Machine
	var nodes []corev1.Node
	waitFor(ctx, t, 90*time.Second, "3 Running Machines with Ready Nodes", func(ctx context.Context) (bool, string, error) {
		var err error
		if machines, err = machinesOf(ctx, hub, w.Namespace, "md-a"); err != nil {
			return false, "", err
		}
		running := 0
		for _, m := range machines {
			if m.Status.Phase == string(clusterv1.MachinePhaseRunning) && m.Status.NodeRef.IsDefined() {
				running++
			}
		}
		if nodes, err = simulatedNodes(ctx, spoke); err != nil {
			return false, "", err
		}
		ready := 0
		for _, n := range nodes {
			if nodeReady(&n) && !hasTaint(&n, "node.kubernetes.io/not-ready") {
				ready++
			}
		}
		return running == 3 && ready == 3, fmt.Sprintf("%d/%d Machines running, %d Nodes ready (%s)", running, len(machines), ready, describeMachines(machines)), nil
	})
	t.Logf("3 Machines Running with Ready Nodes %s after creating the MachineDeployment", time.Since(start).Round(100*time.Millisecond))

	byName := map[string]corev1.Node{}
	for _, n := range nodes {
		byName[n.Name] = n
	}
	for _, m := range machines {
		n, ok := byName[m.Status.NodeRef.Name]
		if !ok {
			t.Fatalf("Machine %s refers to Node %s, which is not a simulated Node", m.Name, m.Status.NodeRef.Name)
		}
		if n.Spec.ProviderID != m.Spec.ProviderID || !strings.HasPrefix(n.Spec.ProviderID, "aws:///us-east-1a/i-") {
			t.Errorf("Node %s providerID %q, Machine %s providerID %q", n.Name, n.Spec.ProviderID, m.Name, m.Spec.ProviderID)
		}
		for k, v := range map[string]string{
			corev1.LabelInstanceTypeStable: "m5.large",
			corev1.LabelTopologyZone:       "us-east-1a",
			corev1.LabelTopologyRegion:     "us-east-1",
			corev1.LabelArchStable:         "amd64",
			corev1.LabelOSStable:           "linux",
			corev1.LabelHostname:           n.Name,
		} {
			if n.Labels[k] != v {
				t.Errorf("Node %s label %s=%q, want %q", n.Name, k, n.Labels[k], v)
			}
		}
		if !hasTaint(&n, world.UnregisteredTaint.Key) {
			t.Errorf("Node %s lacks the bootstrap taint %s: %v", n.Name, world.UnregisteredTaint.Key, n.Spec.Taints)
		}
		// The kubelet's defaults: nothing reserved, eviction at
		// memory.available<100Mi and nodefs.available<10%, 110 pods.
		for res, want := range map[corev1.ResourceName]string{
			corev1.ResourceCPU: "2", corev1.ResourceMemory: "8092Mi", corev1.ResourcePods: "110", corev1.ResourceEphemeralStorage: "18Gi",
		} {
			if got := n.Status.Allocatable[res]; got.Cmp(resource.MustParse(want)) != 0 {
				t.Errorf("Node %s allocatable %s %s, want %s", n.Name, res, got.String(), want)
			}
		}
	}
	if got := len(w.AWS.Instances()); got != 3 {
		t.Errorf("%d running instances, want 3", got)
	}

	// A Deployment scheduled by the real kube-scheduler and run by the simulated kubelets.
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "app"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](3),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "app"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "app"}},
				Spec: corev1.PodSpec{
					Tolerations: []corev1.Toleration{{Key: world.UnregisteredTaint.Key, Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{
						Name: "app", Image: "registry.k8s.io/pause:3.10",
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}},
					}},
				},
			},
		},
	}
	podsStart := time.Now()
	if err := spoke.Create(ctx, deploy); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 60*time.Second, "3 Running Pods of the Deployment", func(ctx context.Context) (bool, string, error) {
		pods := &corev1.PodList{}
		if err := spoke.List(ctx, pods, client.InNamespace("default"), client.MatchingLabels{"app": "app"}); err != nil {
			return false, "", err
		}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != "" && byName[p.Spec.NodeName].Name != "" {
				running++
			}
		}
		if err := spoke.Get(ctx, client.ObjectKeyFromObject(deploy), deploy); err != nil {
			return false, "", err
		}
		return running == 3 && deploy.Status.AvailableReplicas == 3,
			fmt.Sprintf("%d pods, %d running, deployment available %d", len(pods.Items), running, deploy.Status.AvailableReplicas), nil
	})
	t.Logf("Deployment available %s after creation", time.Since(podsStart).Round(100*time.Millisecond))
	testDaemonSet(ctx, t, w, 3)
	testPodTermination(ctx, t, w, nodes[0].Name)
	testReadinessProbe(ctx, t, w, nodes[0].Name)

	// Scale to zero: Cluster API drains and deletes the Machines, the
	// simulated AWS terminates the instances, the Nodes go away.
	scaleStart := time.Now()
	patch := client.MergeFrom(md.DeepCopy())
	md.Spec.Replicas = ptr.To[int32](0)
	if err := hub.Patch(ctx, md, patch); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 90*time.Second, "Machines, AWSMachines and Nodes gone", func(ctx context.Context) (bool, string, error) {
		ms, err := machinesOf(ctx, hub, w.Namespace, "md-a")
		if err != nil {
			return false, "", err
		}
		ams := &infrav1.AWSMachineList{}
		if err := hub.List(ctx, ams, client.InNamespace(w.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: "md-a"}); err != nil {
			return false, "", err
		}
		ns, err := simulatedNodes(ctx, spoke)
		if err != nil {
			return false, "", err
		}
		return len(ms) == 0 && len(ams.Items) == 0 && len(ns) == 0,
			fmt.Sprintf("%d Machines (%s), %d AWSMachines, %d Nodes", len(ms), describeMachines(ms), len(ams.Items), len(ns)), nil
	})
	t.Logf("scaled to zero in %s", time.Since(scaleStart).Round(100*time.Millisecond))
	if got := len(w.AWS.Instances()); got != 0 {
		t.Errorf("%d running instances after scale to zero", got)
	}
	if err := spoke.Delete(ctx, deploy); err != nil {
		t.Error(err)
	}
	if err := hub.Delete(ctx, md); err != nil {
		t.Error(err)
	}
}

func testInsufficientCapacity(ctx context.Context, t *testing.T, w *world.World) {
	hub, spoke := w.Hub.Client, w.Spoke.Client
	w.AWS.SetInsufficientCapacity("m5.large", "us-east-1b", world.CapacityTypeOnDemand, true)
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: w.Namespace, Name: "md-ice", ClusterName: w.ClusterName,
		InfraTemplate: "m5-large", Replicas: 1, FailureDomain: "us-east-1b",
	})
	if err := hub.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	var am infrav1.AWSMachine
	waitFor(ctx, t, 60*time.Second, "the AWSMachine to report InsufficientInstanceCapacity", func(ctx context.Context) (bool, string, error) {
		ams := &infrav1.AWSMachineList{}
		if err := hub.List(ctx, ams, client.InNamespace(w.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: "md-ice"}); err != nil {
			return false, "", err
		}
		if len(ams.Items) != 1 {
			return false, fmt.Sprintf("%d AWSMachines", len(ams.Items)), nil
		}
		am = ams.Items[0]
		for _, c := range am.Status.Conditions {
			if c.Type == infrav1.InstanceReadyCondition && c.Status == corev1.ConditionFalse &&
				c.Reason == infrav1.InstanceProvisionFailedReason && strings.Contains(c.Message, "InsufficientInstanceCapacity") {
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("conditions %v", am.Status.Conditions), nil
	})
	// No instance was launched, so no Node can appear.
	if am.Spec.ProviderID != nil || am.Status.Ready {
		t.Errorf("AWSMachine %s got an instance despite exhausted capacity: providerID %v ready %v", am.Name, ptr.Deref(am.Spec.ProviderID, ""), am.Status.Ready)
	}
	for _, in := range w.AWS.Instances() {
		if in.Zone == "us-east-1b" {
			t.Errorf("instance %s runs in the exhausted zone", in.ID)
		}
	}
	if ns, err := simulatedNodes(ctx, spoke); err != nil || len(ns) != 0 {
		t.Errorf("Nodes %d (err %v), want none", len(ns), err)
	}
	ms, err := machinesOf(ctx, hub, w.Namespace, "md-ice")
	if err != nil || len(ms) != 1 || ms[0].Status.NodeRef.IsDefined() || ms[0].Spec.ProviderID != "" {
		t.Errorf("Machine of md-ice: %s (err %v), want one without providerID and nodeRef", describeMachines(ms), err)
	}

	// Capacity comes back: the launch is retried at once and the Node joins.
	w.AWS.SetInsufficientCapacity("m5.large", "us-east-1b", world.CapacityTypeOnDemand, false)
	waitFor(ctx, t, 60*time.Second, "the Machine to run once capacity is back", func(ctx context.Context) (bool, string, error) {
		ms, err := machinesOf(ctx, hub, w.Namespace, "md-ice")
		if err != nil {
			return false, "", err
		}
		ns, err := simulatedNodes(ctx, spoke)
		if err != nil {
			return false, "", err
		}
		return len(ms) == 1 && ms[0].Status.Phase == string(clusterv1.MachinePhaseRunning) && len(ns) == 1 && nodeReady(&ns[0]) &&
				ns[0].Labels[corev1.LabelTopologyZone] == "us-east-1b",
			fmt.Sprintf("%s, %d Nodes", describeMachines(ms), len(ns)), nil
	})

	// In terminal mode the failure lands in status.failureReason, which Cluster API copies to the Machine.
	w.AWS.SetCapacityErrorsTerminal(true)
	w.AWS.SetInsufficientCapacity("m5.large", "us-east-1c", "", true)
	md2 := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: w.Namespace, Name: "md-ice-terminal", ClusterName: w.ClusterName,
		InfraTemplate: "m5-large", Replicas: 1, FailureDomain: "us-east-1c",
	})
	if err := hub.Create(ctx, md2); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 60*time.Second, "the Machine to carry the terminal failure", func(ctx context.Context) (bool, string, error) {
		ms, err := machinesOf(ctx, hub, w.Namespace, "md-ice-terminal")
		if err != nil || len(ms) != 1 {
			return false, fmt.Sprintf("%d Machines", len(ms)), err
		}
		m := ms[0]
		if m.Status.Deprecated == nil || m.Status.Deprecated.V1Beta1 == nil || m.Status.Deprecated.V1Beta1.FailureReason == nil {
			return false, describeMachines(ms), nil
		}
		// Note: Cluster API v1beta2 no longer sets phase Failed.
		return string(*m.Status.Deprecated.V1Beta1.FailureReason) == "InsufficientInstanceCapacity", describeMachines(ms), nil
	})
	w.AWS.SetCapacityErrorsTerminal(false)
	w.AWS.SetInsufficientCapacity("m5.large", "us-east-1c", "", false)

	for _, d := range []*clusterv1.MachineDeployment{md, md2} {
		if err := hub.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(ctx, t, 60*time.Second, "the Machines and Nodes gone", func(ctx context.Context) (bool, string, error) {
		ms := &clusterv1.MachineList{}
		if err := hub.List(ctx, ms, client.InNamespace(w.Namespace)); err != nil {
			return false, "", err
		}
		ns, err := simulatedNodes(ctx, spoke)
		return len(ms.Items) == 0 && len(ns) == 0, fmt.Sprintf("%s, %d Nodes", describeMachines(ms.Items), len(ns)), err
	})
}

// waitFor polls cond every 200ms until it holds or timeout, failing the test
// with cond's last description.
func waitFor(ctx context.Context, t *testing.T, timeout time.Duration, what string, cond func(context.Context) (bool, string, error)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, desc, err := cond(ctx)
		last = desc
		return ok, err
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v; last state: %s", what, err, last)
	}
}

func machinesOf(ctx context.Context, c client.Client, namespace, md string) ([]clusterv1.Machine, error) {
	list := &clusterv1.MachineList{}
	err := c.List(ctx, list, client.InNamespace(namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md})
	return list.Items, err
}

func simulatedNodes(ctx context.Context, c client.Client) ([]corev1.Node, error) {
	list := &corev1.NodeList{}
	if err := c.List(ctx, list); err != nil {
		return nil, err
	}
	var out []corev1.Node
	for _, n := range list.Items {
		if n.Annotations[world.InstanceIDAnnotation] != "" {
			out = append(out, n)
		}
	}
	return out, nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func hasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

func describeMachines(ms []clusterv1.Machine) string {
	var parts []string
	for _, m := range ms {
		failure := ""
		if m.Status.Deprecated != nil && m.Status.Deprecated.V1Beta1 != nil && m.Status.Deprecated.V1Beta1.FailureReason != nil {
			failure = string(*m.Status.Deprecated.V1Beta1.FailureReason)
		}
		parts = append(parts, fmt.Sprintf("%s phase=%s providerID=%q node=%q failure=%q", m.Name, m.Status.Phase, m.Spec.ProviderID, m.Status.NodeRef.Name, failure))
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

// testSpokeAudit: a NodeClaim status write shows in the workload cluster's
// audit log with its body, and the log is among the world's log files, so a
// conformance failure names who wrote a NodeClaim's conditions.
func testSpokeAudit(ctx context.Context, t *testing.T, w *world.World) {
	nc := &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "audited"},
		Spec: karpv1.NodeClaimSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.cluster.x-k8s.io", Kind: "ClusterAPINodeClass", Name: "default"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: corev1.LabelInstanceTypeStable, Operator: corev1.NodeSelectorOpExists}},
		},
	}
	if err := w.Spoke.Client.Create(ctx, nc); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(nc.DeepCopy())
	nc.StatusConditions().SetTrue(karpv1.ConditionTypeRegistered)
	if err := w.Spoke.Client.Status().Patch(ctx, nc, patch); err != nil {
		t.Fatal(err)
	}
	events, err := w.SpokeAudit()
	if err != nil {
		t.Fatal(err)
	}
	var created, statusPatch bool
	for _, e := range events {
		if e.ObjectRef == nil || e.ObjectRef.Name != "audited" || e.ObjectRef.Resource != "nodeclaims" {
			continue
		}
		switch {
		case e.Verb == "create" && e.ObjectRef.Subresource == "":
			created = true
		case e.Verb == "patch" && e.ObjectRef.Subresource == "status":
			statusPatch = strings.Contains(string(e.RequestObject), karpv1.ConditionTypeRegistered)
		}
	}
	if !created || !statusPatch {
		t.Errorf("spoke audit log %s: NodeClaim create logged %v, status patch with its %s condition logged %v; want both", w.SpokeAuditLog, created, karpv1.ConditionTypeRegistered, statusPatch)
	}
	found := false
	for _, f := range w.LogFiles() {
		found = found || f == w.SpokeAuditLog
	}
	if !found {
		t.Errorf("LogFiles %v leave out the spoke audit log %s", w.LogFiles(), w.SpokeAuditLog)
	}
	if err := w.Spoke.Client.Delete(ctx, nc); err != nil {
		t.Error(err)
	}
}
