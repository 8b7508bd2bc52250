// Package podrun runs the Pods of Deployments in a cluster without
// kube-apiserver's controller manager or a kubelet, as local processes, the
// way a kubelet would run them: each container's command and args, its
// environment (values, field and resource references, ConfigMap and Secret
// keys), its ConfigMap and Secret volumes written as files at their mount
// paths, and its ServiceAccount's token from the API server's TokenRequest
// API with the cluster's CA, where the kubelet mounts them. It then writes
// the Deployment's status as the deployment controller would once the
// processes answer their readiness probe.
//
// What a real node gives a Pod that a process cannot have is emulated, and
// only that: a Pod's own file system (mount paths are rewritten to a
// directory of the Pod, in arguments, environment and mounted files alike);
// cluster DNS (the in-cluster API server address, https://kubernetes.default.svc,
// is rewritten to the API server's real address); a network namespace of
// its own (Karpenter's METRICS_PORT and HEALTH_PROBE_PORT get free ports).
// The image is mapped to a local binary by Options.Binary.
package podrun

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// InClusterServer is the address Pods reach their API server at.
const InClusterServer = "https://kubernetes.default.svc"

// serviceAccountDir is where the kubelet mounts a Pod's token and CA.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// Options shape a Runner.
type Options struct {
	// Config is an admin config of the cluster (the kubelet's and the
	// controller manager's rights: read Secrets and ConfigMaps, request
	// ServiceAccount tokens, write Deployment status).
	Config *rest.Config
	// Selector picks the Deployments to run.
	Selector labels.Selector
	// Binary maps a container's image and first command word (empty when
	// the image's entrypoint runs) to a local executable.
	Binary func(image, command string) (string, error)
	// Dir holds the Pods' files and logs.
	Dir string
	// Env is added to every container's environment (after the Pod's own),
	// for what a test needs of every process.
	Env []string
}

// Runner runs the Pods of the selected Deployments until Stop.
type Runner struct {
	o      Options
	client client.Client
	kube   kubernetes.Interface
	cancel context.CancelFunc
	done   chan struct{}

	mu   sync.Mutex
	pods map[types.NamespacedName]*deploymentPods
}

// deploymentPods are the running processes of one Deployment revision.
type deploymentPods struct {
	revision   string
	generation int64
	started    time.Time
	procs      []*Process
}

// Process is one running container.
type Process struct {
	Name, LogPath string
	// HealthPort and MetricsPort are the process's Karpenter probe and
	// metrics ports.
	HealthPort, MetricsPort int
	cmd                     *exec.Cmd
	done                    chan struct{}
	// probe is the container's readiness probe; ready and failures its
	// state (the runner's loop is its only caller).
	probe    *corev1.Probe
	isReady  bool
	failures int32
}

// Start starts a Runner that looks at the Deployments every 300 ms.
func Start(o Options) (*Runner, error) {
	c, err := client.New(o.Config, client.Options{})
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(o.Config)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Runner{o: o, client: c, kube: kube, cancel: cancel, done: make(chan struct{}), pods: map[types.NamespacedName]*deploymentPods{}}
	go r.loop(ctx)
	return r, nil
}

// Stop stops every process and the Runner.
func (r *Runner) Stop() {
	r.cancel()
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	for key, p := range r.pods {
		stopAll(p.procs)
		delete(r.pods, key)
	}
}

// Processes are the running processes of a Deployment.
func (r *Runner) Processes(key types.NamespacedName) []*Process {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.pods[key]; p != nil {
		return append([]*Process(nil), p.procs...)
	}
	return nil
}

func (r *Runner) loop(ctx context.Context) {
	defer close(r.done)
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for {
		r.sync(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (r *Runner) sync(ctx context.Context) {
	list := &appsv1.DeploymentList{}
	if err := r.client.List(ctx, list, client.MatchingLabelsSelector{Selector: r.o.Selector}); err != nil {
		return // the API server may be away; the next tick retries
	}
	seen := map[types.NamespacedName]bool{}
	for i := range list.Items {
		d := &list.Items[i]
		key := client.ObjectKeyFromObject(d)
		seen[key] = true
		if !d.DeletionTimestamp.IsZero() {
			continue
		}
		r.syncDeployment(ctx, key, d)
	}
	r.mu.Lock()
	for key, p := range r.pods {
		if !seen[key] {
			stopAll(p.procs)
			delete(r.pods, key)
		}
	}
	r.mu.Unlock()
}

// syncDeployment runs the Deployment's current revision (replacing an
// older one's processes, as a rollout with maxSurge 0 does) and writes its
// status.
func (r *Runner) syncDeployment(ctx context.Context, key types.NamespacedName, d *appsv1.Deployment) {
	rev := revision(d)
	r.mu.Lock()
	cur := r.pods[key]
	r.mu.Unlock()
	// A container that exited is started again, as the kubelet restarts
	// it (after a back-off).
	crashed := cur != nil && time.Since(cur.started) > 5*time.Second && anyExited(cur.procs)
	if cur == nil || cur.revision != rev || crashed {
		if cur != nil {
			stopAll(cur.procs)
		}
		procs, err := r.startPods(ctx, d, rev)
		if err != nil {
			logTo(r.o.Dir, fmt.Sprintf("deployment %s: %v", key, err))
			stopAll(procs)
			r.mu.Lock()
			delete(r.pods, key)
			r.mu.Unlock()
			return
		}
		cur = &deploymentPods{revision: rev, procs: procs, started: time.Now()}
		r.mu.Lock()
		r.pods[key] = cur
		r.mu.Unlock()
	}
	cur.generation = d.Generation
	r.writeStatus(ctx, d, cur.procs)
}

// revision identifies what the Pods run: the template and the replicas.
func revision(d *appsv1.Deployment) string {
	raw, _ := json.Marshal(struct {
		T corev1.PodTemplateSpec
		R int32
	}{d.Spec.Template, ptr.Deref(d.Spec.Replicas, 1)})
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:6])
}

func (r *Runner) startPods(ctx context.Context, d *appsv1.Deployment, rev string) ([]*Process, error) {
	var procs []*Process
	for i := range int(ptr.Deref(d.Spec.Replicas, 1)) {
		pod := fmt.Sprintf("%s-%s-%d", d.Name, rev, i)
		p, err := r.startPod(ctx, d, pod)
		if err != nil {
			return procs, fmt.Errorf("pod %s: %w", pod, err)
		}
		procs = append(procs, p)
	}
	return procs, nil
}

func anyExited(procs []*Process) bool {
	for _, p := range procs {
		if p.Exited() {
			return true
		}
	}
	return false
}

func stopAll(procs []*Process) {
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() { defer wg.Done(); p.Stop() }()
	}
	wg.Wait()
}

// writeStatus writes what the deployment controller would: every process
// of the revision is an updated replica, ready once its /readyz answers.
func (r *Runner) writeStatus(ctx context.Context, d *appsv1.Deployment, procs []*Process) {
	ready := int32(0)
	for _, p := range procs {
		if p.ready() {
			ready++
		}
	}
	n := int32(len(procs))
	want := appsv1.DeploymentStatus{
		ObservedGeneration: d.Generation, Replicas: n, UpdatedReplicas: n,
		ReadyReplicas: ready, AvailableReplicas: ready, UnavailableReplicas: n - ready,
	}
	got := d.Status
	if got.ObservedGeneration == want.ObservedGeneration && got.Replicas == want.Replicas && got.UpdatedReplicas == want.UpdatedReplicas &&
		got.ReadyReplicas == want.ReadyReplicas && got.AvailableReplicas == want.AvailableReplicas && got.UnavailableReplicas == want.UnavailableReplicas {
		return
	}
	patch := d.DeepCopy()
	patch.Status = want
	_ = r.client.Status().Patch(ctx, patch, client.MergeFrom(d))
}

// ready probes the process as the kubelet does its readiness probe (an
// HTTP GET of the probe's path on the health port, within its timeout):
// ready at the first success, unready after failureThreshold failures in a
// row. Without a probe, ready while it runs.
func (p *Process) ready() bool {
	if p.Exited() {
		p.isReady = false
		return false
	}
	if p.probe == nil || p.probe.HTTPGet == nil {
		return true
	}
	// Capped: the runner probes in its one loop, the kubelet in parallel.
	timeout := min(time.Duration(max(p.probe.TimeoutSeconds, 1))*time.Second, 5*time.Second)
	c := http.Client{Timeout: timeout}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d%s", p.HealthPort, p.probe.HTTPGet.Path))
	ok := err == nil && resp.StatusCode >= 200 && resp.StatusCode < 400
	if err == nil {
		resp.Body.Close()
	}
	switch {
	case ok:
		p.isReady, p.failures = true, 0
	default:
		p.failures++
		threshold := p.probe.FailureThreshold
		if threshold == 0 {
			threshold = 3
		}
		if p.failures >= threshold {
			p.isReady = false
		}
	}
	return p.isReady
}

// Pid is the process's id (its process group's too).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process ends.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM to the process group, SIGKILL after 20 s.
func (p *Process) Stop() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func logTo(dir, line string) {
	f, err := os.OpenFile(filepath.Join(dir, "podrun.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s %s\n", time.Now().Format(time.RFC3339Nano), line)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// apiServer is the cluster's API server as host and port.
func apiServer(cfg *rest.Config) (string, string, error) {
	u, err := url.Parse(cfg.Host)
	if err != nil {
		return "", "", err
	}
	return u.Hostname(), u.Port(), nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
