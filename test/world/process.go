package world

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/autonode/karpenter-clusterapi/test/placement"
)

// process is a component binary run as a subprocess in its own process group.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
}

func startProcess(name, bin string, args []string, logPath string, cpus placement.CPUs) (*process, error) {
	return startProcessWithEnv(name, bin, args, nil, logPath, cpus)
}

// startProcessWithEnv is startProcess with an environment (nil: the test's).
// cpus pins it (none: anywhere).
func startProcessWithEnv(name, bin string, args, env []string, logPath string, cpus placement.CPUs) (*process, error) {
	// Appended: a component restarted after an outage keeps its earlier log.
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = env
	// Own process group, so Stop can signal everything it spawned; die with
	// the test process if that is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := placement.Start(cmd, cpus); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *process) pid() int {
	if p == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after the grace
// period, and waits for the process to exit.
func (p *process) stop(grace time.Duration) error {
	if p == nil || p.exited() {
		return nil
	}
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, pgid)
		}
	}
	return nil
}

// startSpokeComponents runs the real kube-scheduler and kube-controller-manager
// against a Cluster's spoke and waits until each has acted once.
func (w *World) startSpokeComponents(ctx context.Context, wc *WorkloadCluster) error {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	bin := func(name string) (string, error) {
		p := filepath.Join(assets, name)
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s not found in KUBEBUILDER_ASSETS (%s): run hack/envtest-bins.sh", name, assets)
		}
		return p, nil
	}
	schedBin, err := bin("kube-scheduler")
	if err != nil {
		return err
	}
	kcmBin, err := bin("kube-controller-manager")
	if err != nil {
		return err
	}
	schedArgs := []string{"--kubeconfig=" + wc.SpokeKubeconfig, "--leader-elect=false", "--secure-port=0", "--v=2"}
	if len(w.schedulerConfig) > 0 && wc.Spoke == w.Spoke {
		path, err := w.writeSchedulerConfig(wc.SpokeKubeconfig)
		if err != nil {
			return err
		}
		// With --config, kube-scheduler takes the connection and leader
		// election from the file, not from the flags.
		schedArgs = []string{"--config=" + path, "--secure-port=0", "--v=2"}
	}
	wc.scheduler, err = startProcess("kube-scheduler"+wc.logSuffix, schedBin, schedArgs,
		filepath.Join(w.Dir, "kube-scheduler"+wc.logSuffix+".log"), w.workloadCPUs())
	if err != nil {
		return err
	}
	// Controllers: Deployments, ReplicaSets and DaemonSets, garbage
	// collection (owner references, e.g. ReplicaSets of deleted Deployments),
	// pod GC (Pods of deleted Nodes) and disruption (PodDisruptionBudget
	// status, without which every eviction is refused). No node-lifecycle controller: the simulated kubelet
	// plays its part (not-ready taint removal, Node deletion via the CCM).
	// csrsigning signs the kubelets' approved certificate requests
	// (JoinWithCSR) with a CA of the world's, checking them as in any
	// cluster; nothing approves them but whoever a test runs.
	signerCert, signerKey, err := writeSignerCA(w.Dir, wc.logSuffix)
	if err != nil {
		return err
	}
	wc.controllerManager, err = startProcess("kube-controller-manager"+wc.logSuffix, kcmBin, []string{
		"--kubeconfig=" + wc.SpokeKubeconfig,
		"--controllers=deployment,replicaset,daemonset,garbagecollector,podgc,disruption,csrsigning",
		"--cluster-signing-cert-file=" + signerCert,
		"--cluster-signing-key-file=" + signerKey,
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
		"--concurrent-deployment-syncs=5",
		"--v=1",
	}, filepath.Join(w.Dir, "kube-controller-manager"+wc.logSuffix+".log"), w.workloadCPUs())
	if err != nil {
		return err
	}
	return wc.waitSpokeComponents(ctx)
}

// writeSchedulerConfig writes Options.KubeSchedulerConfig with the spoke's
// kubeconfig and leader election off, and returns its path.
func (w *World) writeSchedulerConfig(kubeconfig string) (string, error) {
	cfg := map[string]any{}
	if err := yaml.Unmarshal(w.schedulerConfig, &cfg); err != nil {
		return "", fmt.Errorf("KubeSchedulerConfig: %w", err)
	}
	conn, _ := cfg["clientConnection"].(map[string]any)
	if conn == nil {
		conn = map[string]any{}
	}
	conn["kubeconfig"] = kubeconfig
	cfg["clientConnection"] = conn
	cfg["leaderElection"] = map[string]any{"leaderElect": false}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return "", err
	}
	path := filepath.Join(w.Dir, "kube-scheduler-config.yaml")
	return path, os.WriteFile(path, data, 0o644)
}

const systemNamespace = "world-system"

// waitSpokeComponents proves both components work: the scheduler marks an
// unschedulable probe Pod PodScheduled=False, and the controller manager
// observes a probe Deployment of 0 replicas.
func (wc *WorkloadCluster) waitSpokeComponents(ctx context.Context) error {
	c := wc.Spoke.Client
	if err := client.IgnoreAlreadyExists(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: systemNamespace}})); err != nil {
		return err
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: systemNamespace, Name: "scheduler-probe"},
		Spec: corev1.PodSpec{
			// Matches no Node ever, so the probe never lands anywhere.
			NodeSelector:                  map[string]string{"world.test/scheduler-probe": "never"},
			Containers:                    []corev1.Container{{Name: "probe", Image: "registry.k8s.io/pause:3.10"}},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
		},
	}
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: systemNamespace, Name: "controller-manager-probe"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](0),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "controller-manager-probe"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "controller-manager-probe"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "probe", Image: "registry.k8s.io/pause:3.10"}}},
			},
		},
	}
	for _, o := range []client.Object{pod, deploy} {
		if err := c.Create(ctx, o); err != nil {
			return err
		}
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, p := range []*process{wc.scheduler, wc.controllerManager} {
			if p.exited() {
				return false, fmt.Errorf("%s exited: %v (log: %s)", p.name, p.err, p.logPath)
			}
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return false, err
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(deploy), deploy); err != nil {
			return false, err
		}
		scheduled := false
		for _, cond := range pod.Status.Conditions {
			scheduled = scheduled || cond.Type == corev1.PodScheduled
		}
		return scheduled && deploy.Status.ObservedGeneration >= deploy.Generation, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for kube-scheduler and kube-controller-manager (logs: %s, %s): %w",
			wc.scheduler.logPath, wc.controllerManager.logPath, err)
	}
	for _, o := range []client.Object{pod, deploy} {
		if err := c.Delete(ctx, o, client.GracePeriodSeconds(0), client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

func (wc *WorkloadCluster) stopSpokeComponents() error {
	var errs []error
	for _, p := range []*process{wc.scheduler, wc.controllerManager} {
		if p != nil {
			errs = append(errs, p.stop(10*time.Second))
		}
	}
	return errors.Join(errs...)
}
