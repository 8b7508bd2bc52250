package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The suites expect what a real cluster running Karpenter has besides the
// nodes Karpenter makes: a tainted system node, and a Deployment
// kube-system/karpenter whose pod runs the controller. They read
// Karpenter's settings from that Deployment's env, change them by patching
// it and wait for the rollout and for the new pod to hold the leader
// election Lease; they fail when a karpenter container restarted.
//
// systemNode plays the kubelet of that system node. It registers the Node
// (tainted CriticalAddonsOnly, as the system node groups of Karpenter's own
// test clusters are), keeps its status and Lease fresh, and runs the pods
// bound to it: a pod of the karpenter Deployment is run as the provider
// binary, with the pod's container args and env, restarted (restartCount+1)
// when it exits, Ready once its /readyz answers, stopped with SIGTERM and
// the pod's grace period when the pod is deleted. Any other pod bound to it
// (a DaemonSet tolerating every taint) is reported running.
//
// What differs from a real pod, on purpose: the process runs on this
// machine's network, so the kubelet gives it free metrics and health ports
// (METRICS_PORT, HEALTH_PROBE_PORT); and its hostname is this machine's, not
// the pod's, so the provider runs with DISABLE_LEADER_ELECTION=true and the
// kubelet writes the leader election Lease kube-system/karpenter-leader-election
// for the pod it runs ("<pod>_<random>", as controller-runtime names a holder)
// once the pod is Ready. The Deployment's Recreate strategy keeps two
// providers from ever running at once.
type systemNode struct {
	client      client.Client
	name        string
	providerBin string
	logDir      string

	mu   sync.Mutex
	pods map[types.UID]*podProcess
}

// SystemNodeName is the name of the conformance world's system node.
const SystemNodeName = "conformance-system"

// KarpenterPodLabel marks the karpenter Deployment's pods (the label the
// suites list them by).
const KarpenterPodLabel = "app.kubernetes.io/instance"

const leaseName = "karpenter-leader-election"

type podProcess struct {
	pod          types.NamespacedName
	cmd          *exec.Cmd
	done         chan struct{}
	healthPort   int
	restarts     int32
	started      time.Time
	stopping     bool
	stopped      chan struct{} // closed once a requested stop finished
	holderID     string
	leaseRenewed time.Time
	logFilePath  string
}

func newSystemNode(c client.Client, providerBin, logDir string) *systemNode {
	return &systemNode{client: c, name: SystemNodeName, providerBin: providerBin, logDir: logDir, pods: map[types.UID]*podProcess{}}
}

// register creates the Node and waits until it is Ready and untainted by
// the not-ready taint.
func (s *systemNode) register(ctx context.Context) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.name,
			Labels: map[string]string{
				corev1.LabelHostname: s.name, corev1.LabelOSStable: "linux", corev1.LabelArchStable: "amd64",
				"node-role.kubernetes.io/system": "",
			},
		},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "CriticalAddonsOnly", Value: "true", Effect: corev1.TaintEffectNoSchedule}}},
	}
	if err := s.client.Create(ctx, node); err != nil {
		return fmt.Errorf("registering the system node: %w", err)
	}
	return s.heartbeat(ctx)
}

// heartbeat posts Ready, removes the not-ready taint admission added, and
// renews the node Lease.
func (s *systemNode) heartbeat(ctx context.Context) error {
	node := &corev1.Node{}
	if err := s.client.Get(ctx, client.ObjectKey{Name: s.name}, node); err != nil {
		return err
	}
	now := metav1.Now()
	patch := client.MergeFrom(node.DeepCopy())
	node.Status.Capacity = corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("16Gi"),
		corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceEphemeralStorage: resource.MustParse("20Gi"),
	}
	node.Status.Allocatable = node.Status.Capacity.DeepCopy()
	node.Status.NodeInfo = corev1.NodeSystemInfo{KubeletVersion: "v1.36.3", OperatingSystem: "linux", Architecture: "amd64"}
	node.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: now, LastTransitionTime: readySince(node, now),
	}}
	if err := s.client.Status().Patch(ctx, node, patch); err != nil {
		return err
	}
	var kept []corev1.Taint
	for _, t := range node.Spec.Taints {
		if t.Key != corev1.TaintNodeNotReady {
			kept = append(kept, t)
		}
	}
	if len(kept) != len(node.Spec.Taints) {
		patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
		node.Spec.Taints = kept
		if err := s.client.Patch(ctx, node, patch); err != nil {
			return err
		}
	}
	return s.renewLease(ctx, "kube-node-lease", s.name, s.name, 40)
}

func readySince(node *corev1.Node, now metav1.Time) metav1.Time {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			return c.LastTransitionTime
		}
	}
	return now
}

func (s *systemNode) renewLease(ctx context.Context, namespace, name, holder string, seconds int32) error {
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{}
	err := s.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, lease)
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To(seconds),
				AcquireTime: &now, RenewTime: &now,
			},
		}
		return client.IgnoreAlreadyExists(s.client.Create(ctx, lease))
	}
	if err != nil {
		return err
	}
	if ptr.Deref(lease.Spec.HolderIdentity, "") != holder {
		lease.Spec.AcquireTime = &now
		lease.Spec.LeaseTransitions = ptr.To(ptr.Deref(lease.Spec.LeaseTransitions, 0) + 1)
	}
	lease.Spec.HolderIdentity = ptr.To(holder)
	lease.Spec.LeaseDurationSeconds = ptr.To(seconds)
	lease.Spec.RenewTime = &now
	return s.client.Update(ctx, lease)
}

// run plays the kubelet until ctx ends, then stops every process it started.
func (s *systemNode) run(ctx context.Context) {
	defer s.stopAll()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	lastBeat := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if time.Since(lastBeat) > 10*time.Second {
			if err := s.heartbeat(ctx); err == nil {
				lastBeat = time.Now()
			}
		}
		_ = s.syncPods(ctx)
	}
}

func (s *systemNode) syncPods(ctx context.Context) error {
	pods := &corev1.PodList{}
	if err := s.client.List(ctx, pods, client.MatchingFields{"spec.nodeName": s.name}); err != nil {
		return err
	}
	var errs []error
	for i := range pods.Items {
		errs = append(errs, s.syncPod(ctx, &pods.Items[i]))
	}
	return errors.Join(errs...)
}

func (s *systemNode) syncPod(ctx context.Context, pod *corev1.Pod) error {
	isKarpenter := pod.Labels[KarpenterPodLabel] == "karpenter"
	s.mu.Lock()
	p := s.pods[pod.UID]
	s.mu.Unlock()
	if !pod.DeletionTimestamp.IsZero() {
		if p != nil {
			if !s.stop(p, time.Duration(ptr.Deref(pod.DeletionGracePeriodSeconds, 30))*time.Second) {
				return nil // still stopping
			}
			s.mu.Lock()
			delete(s.pods, pod.UID)
			s.mu.Unlock()
		}
		err := s.client.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: &pod.UID})
		return client.IgnoreNotFound(err)
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	ready := true
	if isKarpenter {
		var err error
		if p, err = s.ensureRunning(pod, p); err != nil {
			return err
		}
		ready = p.ready()
		if ready {
			if p.holderID == "" {
				p.holderID = pod.Name + "_" + rand.String(8)
			}
			// Renewed like controller-runtime's leader election (every 2 s
			// within a 15 s lease), not at every sync.
			if time.Since(p.leaseRenewed) > 2*time.Second {
				if err := s.renewLease(ctx, pod.Namespace, leaseName, p.holderID, 15); err != nil {
					return err
				}
				p.leaseRenewed = time.Now()
			}
		}
	}
	return s.postPodStatus(ctx, pod, p, ready)
}

// ensureRunning starts the pod's process, or starts it again when it exited.
func (s *systemNode) ensureRunning(pod *corev1.Pod, p *podProcess) (*podProcess, error) {
	if p != nil && !p.exited() {
		return p, nil
	}
	restarts := int32(0)
	if p != nil {
		restarts = p.restarts + 1
		if time.Since(p.started) < 2*time.Second {
			return p, nil // back off a little, as a kubelet does
		}
	}
	np, err := s.start(pod)
	if err != nil {
		return nil, err
	}
	np.restarts = restarts
	s.mu.Lock()
	s.pods[pod.UID] = np
	s.mu.Unlock()
	return np, nil
}

func (s *systemNode) start(pod *corev1.Pod) (*podProcess, error) {
	if len(pod.Spec.Containers) != 1 {
		return nil, fmt.Errorf("pod %s/%s: the system node runs karpenter pods of exactly one container", pod.Namespace, pod.Name)
	}
	c := pod.Spec.Containers[0]
	metrics, err := freePort()
	if err != nil {
		return nil, err
	}
	health, err := freePort()
	if err != nil {
		return nil, err
	}
	env := os.Environ()
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			continue // no downward API here; the provider reads none
		}
		env = append(env, e.Name+"="+e.Value)
	}
	env = append(env,
		fmt.Sprintf("METRICS_PORT=%d", metrics), fmt.Sprintf("HEALTH_PROBE_PORT=%d", health),
		"DISABLE_LEADER_ELECTION=true")
	logPath := filepath.Join(s.logDir, "provider-"+pod.Name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(s.providerBin, c.Args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting the provider for pod %s: %w", pod.Name, err)
	}
	p := &podProcess{
		pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, cmd: cmd, done: make(chan struct{}),
		healthPort: health, started: time.Now(), logFilePath: logPath,
	}
	go func() {
		_ = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *podProcess) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ready is the pod's readiness probe: GET /readyz on its health port.
func (p *podProcess) ready() bool {
	if p.exited() {
		return false
	}
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", p.healthPort))
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// stop sends SIGTERM once and SIGKILL after grace; it reports whether the
// process is gone.
func (s *systemNode) stop(p *podProcess, grace time.Duration) bool {
	s.mu.Lock()
	if !p.stopping {
		p.stopping = true
		p.stopped = make(chan struct{})
		go func() {
			defer close(p.stopped)
			if p.exited() {
				return
			}
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(grace):
				_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
				<-p.done
			}
		}()
	}
	stopped := p.stopped
	s.mu.Unlock()
	select {
	case <-stopped:
		return true
	default:
		return false
	}
}

func (s *systemNode) stopAll() {
	s.mu.Lock()
	all := make([]*podProcess, 0, len(s.pods))
	for _, p := range s.pods {
		all = append(all, p)
	}
	s.mu.Unlock()
	for _, p := range all {
		s.stop(p, 20*time.Second)
	}
	for _, p := range all {
		<-p.stopped
	}
}

func (s *systemNode) postPodStatus(ctx context.Context, pod *corev1.Pod, p *podProcess, ready bool) error {
	st := pod.Status.DeepCopy()
	now := metav1.Now()
	st.Phase = corev1.PodRunning
	st.HostIP = "10.0.0.10"
	st.PodIP = "10.0.0.10"
	if st.StartTime == nil {
		st.StartTime = &now
	}
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	setCondition(st, corev1.PodScheduled, corev1.ConditionTrue, now)
	setCondition(st, corev1.PodInitialized, corev1.ConditionTrue, now)
	setCondition(st, corev1.ContainersReady, status, now)
	setCondition(st, corev1.PodReady, status, now)
	st.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: ready, Started: ptr.To(true)}
		if p != nil {
			cs.RestartCount = p.restarts
			cs.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(p.started)}}
		} else {
			cs.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: *st.StartTime}}
		}
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
	}
	if equalStatus(st, &pod.Status) {
		return nil
	}
	pod.Status = *st
	err := s.client.Status().Update(ctx, pod)
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func setCondition(st *corev1.PodStatus, t corev1.PodConditionType, status corev1.ConditionStatus, now metav1.Time) {
	for i := range st.Conditions {
		if st.Conditions[i].Type == t {
			if st.Conditions[i].Status != status {
				st.Conditions[i].Status = status
				st.Conditions[i].LastTransitionTime = now
			}
			return
		}
	}
	st.Conditions = append(st.Conditions, corev1.PodCondition{Type: t, Status: status, LastTransitionTime: now})
}
