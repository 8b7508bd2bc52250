package conformance

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// FeatureGates are the provider's Karpenter feature gates in the runs:
// what Karpenter's own e2e runs enable (its Makefile's HELM_OPTS as the
// kwok chart renders them).
const FeatureGates = "StaticCapacity=true,SpotToSpotConsolidation=false,NodeRepair=true,CapacityBuffer=true,PodDeletionCostManagement=false"

// RepairCondition is the node condition the Repair specs inject
// (--repair-condition): node-problem-detector's KernelDeadlock, which the
// provider repairs after 30 s (REPAIR_CONDITIONS). The specs backdate it by
// a day, but core measures a toleration from no earlier than the node's
// registration, so it must fit the specs' Eventually timeout (as KWOK's 30 s
// does); a production setting would be minutes.
const RepairCondition = "KernelDeadlock=True"

// ImagePullDelay is how long a fresh node of every group's world takes to
// pull an image before it starts the first Pod that runs it (once per image
// and node): a real node pulls every image of its first Pods, a second or
// so each for the small images the suites run. Starting them at once let a
// Drift spec read a Node before Karpenter had initialized it, while its Pod
// already ran, and the spec's update of that read (ExpectUpdated forces the
// current resourceVersion) removed the karpenter.sh/initialized label core
// had set since: the node was never a disruption candidate again (Machine
// mode, 2026-11-27, docs/conformance.md).
const ImagePullDelay = 2 * time.Second

// groupWorld is one group's fresh world: the e2e world, the fleet of the
// mode, the system node running the karpenter Deployment, and the suites'
// default NodeClass and NodePool files.
type groupWorld struct {
	w                           *world.World
	sys                         *systemNode
	stopSys                     context.CancelFunc
	sysDone                     chan struct{}
	nodeClassFile, nodePoolFile string
}

// startGroupWorld starts a world for a mode. On error everything started is
// stopped again.
func startGroupWorld(ctx context.Context, mode Mode, g Group, providerBin, dir string) (gw *groupWorld, err error) {
	schedulerConfig, err := karpenterSchedulerConfig()
	if err != nil {
		return nil, err
	}
	w, err := world.Start(ctx, world.Options{KubeSchedulerConfig: schedulerConfig, Zones: Zones, ProvisionDelay: g.BootDelay, NodeReadyDelay: g.ReadyDelay, ImagePullDelay: ImagePullDelay})
	if err != nil {
		return nil, err
	}
	gw = &groupWorld{w: w}
	defer func() {
		if err != nil {
			gw.stop(true)
		}
	}()
	if err := createBootstrapSecret(ctx, w); err != nil {
		return gw, err
	}
	switch mode {
	case ModeMachineDeployment:
		err = createMachineDeploymentFleet(ctx, w, bootstrapSecretName(w))
	case ModeMachine:
		if err = createBootstrapTemplate(ctx, w); err == nil {
			err = createMachineTemplateFleet(ctx, w)
		}
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		return gw, err
	}
	gw.sys = newSystemNode(w.Spoke.Client, providerBin, dir)
	if err := gw.sys.register(ctx); err != nil {
		return gw, err
	}
	sysCtx, cancel := context.WithCancel(context.Background())
	gw.stopSys, gw.sysDone = cancel, make(chan struct{})
	go func() { defer close(gw.sysDone); gw.sys.run(sysCtx) }()
	if err := w.Spoke.Client.Create(ctx, schedulerMirrorPod()); err != nil {
		return gw, fmt.Errorf("creating kube-scheduler's mirror pod: %w", err)
	}
	if err := w.Spoke.Client.Create(ctx, karpenterDeployment(w)); err != nil {
		return gw, fmt.Errorf("creating the karpenter Deployment: %w", err)
	}
	if err := waitKarpenterReady(ctx, w.Spoke.Client); err != nil {
		return gw, err
	}
	gw.nodeClassFile = filepath.Join(dir, "default-nodeclass.yaml")
	gw.nodePoolFile = filepath.Join(dir, "default-nodepool.yaml")
	if err := os.WriteFile(gw.nodeClassFile, []byte(nodeClassManifest(mode, w)), 0o644); err != nil {
		return gw, err
	}
	return gw, os.WriteFile(gw.nodePoolFile, []byte(defaultNodePool(g)), 0o644)
}

// stop stops the provider (the system node's pods), then the world; the
// world's directory is kept when keep is set.
func (gw *groupWorld) stop(keep bool) error {
	if gw.stopSys != nil {
		gw.stopSys()
		<-gw.sysDone
	}
	gw.w.KeepDir = keep
	return gw.w.Stop()
}

// karpenterDeployment is kube-system/karpenter as Karpenter's chart shapes
// it (labels the suites select on, one container "controller"), pinned to
// the system node, with the provider's flags as args and its settings as env.
func karpenterDeployment(w *world.World) *appsv1.Deployment {
	labels := map[string]string{"app.kubernetes.io/name": "karpenter", KarpenterPodLabel: "karpenter"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "karpenter", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			// Never two providers at once: the system node cannot give them the
			// leader election a real pod would hold (see systemNode).
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{corev1.LabelHostname: SystemNodeName},
					Tolerations:                   []corev1.Toleration{{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists}},
					PriorityClassName:             "system-cluster-critical",
					TerminationGracePeriodSeconds: ptr.To[int64](30),
					Containers: []corev1.Container{{
						Name:  "controller",
						Image: "karpenter-clusterapi:conformance",
						Args: []string{
							"--kubeconfig=" + w.SpokeKubeconfig,
							"--cluster-api-kubeconfig=" + w.HubKubeconfig,
							"--cluster-api-namespace=" + w.Namespace,
							"--cluster-api-cluster-name=" + w.ClusterName,
						},
						Env: []corev1.EnvVar{
							{Name: "LOG_LEVEL", Value: "debug"},
							{Name: "FEATURE_GATES", Value: FeatureGates},
							{Name: "REPAIR_CONDITIONS", Value: RepairCondition + ":30s"},
						},
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
							corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("512Mi"),
						}},
					}},
				},
			},
		},
	}
}

// schedulerConfigMountPath is where Karpenter's kind cluster mounts its
// kube-scheduler configuration; the DefaultTopologySpreadConstraints specs
// look for it in kube-scheduler's pod to know the cluster's scheduler has the
// profile they test (test/suites/regression/defaultconstraints_test.go).
const schedulerConfigMountPath = "/etc/kubernetes/karpenter-scheduler-config/kube-scheduler-config.yaml"

// karpenterSchedulerConfig is the KubeSchedulerConfiguration Karpenter's own
// e2e cluster runs kube-scheduler with (an extra profile with default
// topology spread constraints), from the karpenter module in go.mod.
func karpenterSchedulerConfig() ([]byte, error) {
	dir, err := environment.ModuleDir("sigs.k8s.io/karpenter")
	if err != nil {
		return nil, err
	}
	return os.ReadFile(filepath.Join(dir, "test", "suites", "regression", "testdata", "kube-scheduler-config.yaml"))
}

// schedulerMirrorPod is kube-scheduler's pod as a kubeadm control plane shows
// it (the mirror of a static pod): the world's kube-scheduler runs as a
// process with that configuration, on the system node.
func schedulerMirrorPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "kube-system", Name: "kube-scheduler-" + SystemNodeName,
			Labels:      map[string]string{"component": "kube-scheduler", "tier": "control-plane"},
			Annotations: map[string]string{"kubernetes.io/config.mirror": "world", "kubernetes.io/config.source": "file"},
		},
		Spec: corev1.PodSpec{
			NodeName:          SystemNodeName,
			PriorityClassName: "system-node-critical",
			Tolerations:       []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name: "kube-scheduler", Image: "registry.k8s.io/kube-scheduler:v1.36.3",
				Command: []string{"kube-scheduler", "--config=" + schedulerConfigMountPath},
			}},
		},
	}
}

// waitKarpenterReady waits until a karpenter pod is Ready: the provider
// answered its readiness probe.
func waitKarpenterReady(ctx context.Context, c client.Client) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods := &corev1.PodList{}
		if err := c.List(ctx, pods, client.InNamespace("kube-system"), client.MatchingLabels{KarpenterPodLabel: "karpenter"}); err != nil {
			last = err.Error()
			return false, nil
		}
		for _, p := range pods.Items {
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					return true, nil
				}
			}
			last = fmt.Sprintf("pod %s: phase %q, node %q", p.Name, p.Status.Phase, p.Spec.NodeName)
		}
		if len(pods.Items) == 0 {
			last = "no karpenter pod yet"
		}
		return false, nil
	})
	if err != nil {
		return errors.Join(fmt.Errorf("waiting for the karpenter pod to be Ready (%s)", last), err)
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
