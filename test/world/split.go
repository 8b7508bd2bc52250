package world

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/autonode/karpenter-clusterapi/test/placement"
)

// A split world runs its two sides in processes of their own, as a real
// deployment runs the management cluster and the workload cluster on
// different machines, each side on a CPU set of its own when asked:
//
//   - the management side: the hub's kube-apiserver and etcd, and a "hub"
//     side process (this test binary run again) with Cluster API's
//     controllers and webhooks, the simulated AWS and bootstrap provider;
//   - the workload side: the spoke's kube-apiserver and etcd, the
//     kube-scheduler and kube-controller-manager, and a "kubelet" side
//     process with the simulated kubelet, which learns the simulated
//     instances from the hub side over a stream (as a real kubelet knows its
//     own machine, without reading the management cluster).
//
// The test process keeps only its clients. The side-by-side bench uses it
// (test/e2e): every other test runs the in-process world, which starts
// faster. A test binary that starts split worlds must call RunSideIfAsked
// first thing in its TestMain.

// SplitOptions place the two sides of a split world (Options.Split).
type SplitOptions struct {
	// HubCPUs and WorkloadCPUs are the CPU sets of the management side and
	// of the workload side; empty: no pinning (the shared placement).
	HubCPUs, WorkloadCPUs placement.CPUs
}

// Sides of the world's processes (Process.Side).
const (
	SideHub      = "hub"
	SideWorkload = "workload"
)

// Process is one process of the world.
type Process struct {
	Name string
	Side string // SideHub or SideWorkload
	Pid  int
}

// sideEnv names the side spec file of a side process.
const sideEnv = "WORLD_SIDE_SPEC"

// sideSpec is what a side process runs.
type sideSpec struct {
	Role            string        `json:"role"` // roleHub or roleKubelet
	HubKubeconfig   string        `json:"hubKubeconfig,omitempty"`
	SpokeKubeconfig string        `json:"spokeKubeconfig,omitempty"`
	Namespace       string        `json:"namespace"`
	ClusterName     string        `json:"clusterName"`
	Zones           []string      `json:"zones,omitempty"`
	ProvisionDelay  time.Duration `json:"provisionDelay,omitempty"`
	// InstancesURL is the hub side's control address (kubelet side).
	InstancesURL string `json:"instancesURL,omitempty"`
	// ReadyFile is where the side writes its control address once it serves.
	ReadyFile string `json:"readyFile"`
}

const (
	roleHub     = "hub"
	roleKubelet = "kubelet"
)

// sideProcess is a running side process.
type sideProcess struct {
	*process
	addr string // its control address (hub side)
}

// RunSideIfAsked runs this process as a side of a split world when the
// world started it so, and exits; otherwise it returns at once. Call it
// first thing in TestMain of a package that starts split worlds.
func RunSideIfAsked() {
	path := os.Getenv(sideEnv)
	if path == "" {
		return
	}
	if err := runSide(path); err != nil {
		fmt.Fprintln(os.Stderr, "world side:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runSide(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec sideSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return fmt.Errorf("side spec %s: %w", path, err)
	}
	log := zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true))
	ctrl.SetLogger(log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx = ctrl.LoggerInto(ctx, log)
	switch spec.Role {
	case roleHub:
		return runHubSide(ctx, spec, log)
	case roleKubelet:
		return runKubeletSide(ctx, spec, log)
	}
	return fmt.Errorf("side spec %s: unknown role %q", path, spec.Role)
}

func configFrom(kubeconfig string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 500, 1000 // as environment.Start's clients
	return cfg, nil
}

// runManagers starts managers until ctx ends, then waits for them.
func runManagers(ctx context.Context, managers ...ctrl.Manager) func() error {
	var wg sync.WaitGroup
	errs := make([]error, len(managers))
	for i, m := range managers {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = m.Start(ctx) }()
	}
	return func() error {
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			return errors.New("a controller manager did not stop within 60s")
		}
		var out []error
		for _, err := range errs {
			if err != nil && !errors.Is(err, context.Canceled) {
				out = append(out, err)
			}
		}
		return errors.Join(out...)
	}
}

// runHubSide runs Cluster API's controllers and webhooks, the simulated
// AWS and bootstrap provider against the hub, and serves the simulated
// instances and the provisioning delay on a control address.
func runHubSide(ctx context.Context, spec sideSpec, log logr.Logger) error {
	cfg, err := configFrom(spec.HubKubeconfig)
	if err != nil {
		return err
	}
	aws := newSimAWS(spec.Zones, spec.ProvisionDelay)
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hub, err := newHubManager(mctx, cfg, log.WithName("capi"), false)
	if err != nil {
		return err
	}
	defer func() { _ = hub.webhooks.Cleanup() }()
	awsMgr, err := newAWSManager(cfg, aws, log.WithName("aws"))
	if err != nil {
		return err
	}
	bootMgr, err := newBootstrapManager(cfg, log.WithName("bootstrap"))
	if err != nil {
		return err
	}
	wait := runManagers(mctx, hub.mgr, awsMgr, bootMgr)
	defer hub.shutdownClusterCache()
	if err := hub.installWebhooks(ctx, cfg); err != nil {
		cancel()
		return errors.Join(fmt.Errorf("installing Cluster API webhooks: %w", err), wait())
	}
	srv, addr, err := serveControl(newInstanceFeed(aws), aws)
	if err != nil {
		cancel()
		return errors.Join(err, wait())
	}
	defer srv.Close()
	if err := writeReady(spec.ReadyFile, addr); err != nil {
		cancel()
		return errors.Join(err, wait())
	}
	<-ctx.Done()
	cancel()
	return wait()
}

// runKubeletSide runs the simulated kubelet of the Cluster's instances
// against its spoke, with the instances the hub side streams.
func runKubeletSide(ctx context.Context, spec sideSpec, log logr.Logger) error {
	cfg, err := configFrom(spec.SpokeKubeconfig)
	if err != nil {
		return err
	}
	instances := newRemoteInstances(spec.InstancesURL, log.WithName("instances"))
	go instances.follow(ctx)
	select {
	case <-instances.synced:
	case <-ctx.Done():
		return nil
	case <-time.After(time.Minute):
		return fmt.Errorf("no instance list from the hub side (%s) within a minute", spec.InstancesURL)
	}
	key := types.NamespacedName{Namespace: spec.Namespace, Name: spec.ClusterName}
	mgr, err := newSpokeManager(cfg, instances, key, nil, nil, nil, nil, log.WithName("kubelet"))
	if err != nil {
		return err
	}
	wait := runManagers(ctx, mgr)
	if err := writeReady(spec.ReadyFile, "-"); err != nil {
		return err
	}
	<-ctx.Done()
	return wait()
}

func writeReady(path, addr string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(addr), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// instanceFeed fans SimAWS's instance changes out to the streams that follow them.
type instanceFeed struct {
	aws  *SimAWS
	mu   sync.Mutex
	subs map[chan string]bool
}

func newInstanceFeed(aws *SimAWS) *instanceFeed {
	f := &instanceFeed{aws: aws, subs: map[chan string]bool{}}
	aws.onInstanceChange(func(host string) {
		f.mu.Lock()
		defer f.mu.Unlock()
		for ch := range f.subs {
			ch <- host // buffered far beyond a burst's changes
		}
	})
	return f
}

// feedLine is one line of the instance stream: an instance as it is now,
// or the end of the list of those that exist when the stream starts.
type feedLine struct {
	Instance *Instance `json:"instance,omitempty"`
	Synced   bool      `json:"synced,omitempty"`
}

func (f *instanceFeed) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	ch := make(chan string, 1<<16)
	f.mu.Lock()
	f.subs[ch] = true
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.subs, ch)
		f.mu.Unlock()
	}()
	rw.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(rw)
	flusher, _ := rw.(http.Flusher)
	send := func(l feedLine) error {
		if err := enc.Encode(l); err != nil {
			return err
		}
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	}
	// Subscribed before the list: a change made meanwhile is sent twice, never lost.
	f.aws.mu.Lock()
	all := make([]Instance, 0, len(f.aws.byID))
	for _, in := range f.aws.byID {
		all = append(all, *in)
	}
	f.aws.mu.Unlock()
	for i := range all {
		if send(feedLine{Instance: &all[i]}) != nil {
			return
		}
	}
	if send(feedLine{Synced: true}) != nil {
		return
	}
	for {
		select {
		case <-req.Context().Done():
			return
		case host := <-ch:
			in, ok := f.aws.instanceByHostname(host)
			if !ok {
				continue
			}
			if send(feedLine{Instance: &in}) != nil {
				return
			}
		}
	}
}

// serveControl serves the hub side's control endpoints on a loopback port:
// /instances (the stream) and /provision-delay (POST ?d=<duration>).
func serveControl(feed *instanceFeed, aws *SimAWS) (*http.Server, string, error) {
	mux := http.NewServeMux()
	mux.Handle("/instances", feed)
	mux.HandleFunc("/provision-delay", func(rw http.ResponseWriter, req *http.Request) {
		d, err := time.ParseDuration(req.URL.Query().Get("d"))
		if req.Method != http.MethodPost || err != nil || d < 0 {
			http.Error(rw, "POST /provision-delay?d=<duration>", http.StatusBadRequest)
			return
		}
		aws.SetProvisionDelay(d)
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return srv, "http://" + l.Addr().String(), nil
}

// remoteInstances is the kubelet side's copy of the hub side's instances.
type remoteInstances struct {
	url string
	log logr.Logger

	mu        sync.Mutex
	byHost    map[string]Instance
	listeners []func(string)
	synced    chan struct{}
	once      sync.Once
}

func newRemoteInstances(base string, log logr.Logger) *remoteInstances {
	return &remoteInstances{url: base + "/instances", log: log, byHost: map[string]Instance{}, synced: make(chan struct{})}
}

func (r *remoteInstances) instanceByHostname(host string) (Instance, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	in, ok := r.byHost[host]
	return in, ok
}

func (r *remoteInstances) onInstanceChange(f func(string)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.listeners = append(r.listeners, f)
}

// follow reads the stream until ctx ends, again after each break.
func (r *remoteInstances) follow(ctx context.Context) {
	for ctx.Err() == nil {
		if err := r.read(ctx); err != nil && ctx.Err() == nil {
			r.log.Info("instance stream broke; reconnecting", "error", err.Error())
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (r *remoteInstances) read(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", r.url, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20) // user data rides along
	for sc.Scan() {
		var l feedLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("instance stream: %w", err)
		}
		if l.Synced {
			r.once.Do(func() { close(r.synced) })
			continue
		}
		if l.Instance == nil {
			continue
		}
		r.mu.Lock()
		r.byHost[l.Instance.Hostname] = *l.Instance
		ls := append([]func(string){}, r.listeners...)
		r.mu.Unlock()
		for _, f := range ls {
			f(l.Instance.Hostname)
		}
	}
	return sc.Err()
}

// startSides starts the two side processes of a split world (the API
// servers run already) and returns once both serve.
func (w *World) startSides(ctx context.Context, o Options, first *WorkloadCluster) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	hubSpec := sideSpec{
		Role: roleHub, HubKubeconfig: w.HubKubeconfig, Namespace: w.Namespace, ClusterName: w.ClusterName,
		Zones: o.Zones, ProvisionDelay: o.ProvisionDelay, ReadyFile: filepath.Join(w.Dir, "side-hub.ready"),
	}
	if w.hubSide, err = w.startSide(ctx, self, hubSpec, o.Split.HubCPUs); err != nil {
		return err
	}
	kubeletSpec := sideSpec{
		Role: roleKubelet, SpokeKubeconfig: first.SpokeKubeconfig, Namespace: w.Namespace, ClusterName: first.Name,
		InstancesURL: w.hubSide.addr, ReadyFile: filepath.Join(w.Dir, "side-kubelet.ready"),
	}
	w.kubeletSide, err = w.startSide(ctx, self, kubeletSpec, o.Split.WorkloadCPUs)
	return err
}

func (w *World) startSide(ctx context.Context, self string, spec sideSpec, cpus placement.CPUs) (*sideProcess, error) {
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	specPath := filepath.Join(w.Dir, "side-"+spec.Role+".json")
	if err := os.WriteFile(specPath, raw, 0o600); err != nil {
		return nil, err
	}
	env := append(os.Environ(), sideEnv+"="+specPath)
	// -test.run matches nothing: a binary whose TestMain forgot
	// RunSideIfAsked runs no test as a side.
	p, err := startProcessWithEnv("world-"+spec.Role, self, []string{"-test.run=^$"}, env, filepath.Join(w.Dir, "world-"+spec.Role+".log"), cpus)
	if err != nil {
		return nil, err
	}
	s := &sideProcess{process: p}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if raw, err := os.ReadFile(spec.ReadyFile); err == nil {
			s.addr = string(raw)
			return s, nil
		}
		if p.exited() {
			return nil, fmt.Errorf("the %s side process exited: %v (log %s)", spec.Role, p.err, p.logPath)
		}
		if time.Now().After(deadline) {
			_ = p.stop(10 * time.Second)
			return nil, fmt.Errorf("the %s side process did not serve within 2 minutes (log %s)", spec.Role, p.logPath)
		}
		select {
		case <-ctx.Done():
			_ = p.stop(10 * time.Second)
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// SetProvisionDelay sets how long instances launched from now on stay
// pending (SimAWS.SetProvisionDelay), in an in-process world or a split one.
func (w *World) SetProvisionDelay(d time.Duration) error {
	if w.hubSide == nil {
		if w.AWS == nil {
			return errors.New("SetProvisionDelay: this world runs CAPA, whose instances the EC2 simulator times")
		}
		w.AWS.SetProvisionDelay(d)
		return nil
	}
	resp, err := http.Post(w.hubSide.addr+"/provision-delay?d="+url.QueryEscape(d.String()), "", nil)
	if err != nil {
		return fmt.Errorf("setting the provisioning delay on the hub side: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("setting the provisioning delay on the hub side: %s", resp.Status)
	}
	return nil
}

// Zones are the failure domains the world's AWSClusters report.
func (w *World) Zones() []string { return append([]string(nil), w.zones...) }

// Split reports whether the world runs its sides in processes of their own.
func (w *World) Split() bool { return w.hubSide != nil }

// Processes are the world's processes by side: the API servers and etcds,
// the kube-schedulers and kube-controller-managers, and a split world's
// side processes. An in-process world's controllers and simulators run in
// the calling process, which is not listed.
func (w *World) Processes() ([]Process, error) {
	var out []Process
	add := func(name, side string, pid int) {
		if pid > 0 {
			out = append(out, Process{Name: name, Side: side, Pid: pid})
		}
	}
	apiServer, etcd, err := w.Hub.Pids()
	if err != nil {
		return nil, err
	}
	add("hub kube-apiserver", SideHub, apiServer)
	add("hub etcd", SideHub, etcd)
	if w.hubSide != nil {
		add("hub side (Cluster API, simulated AWS and bootstrap)", SideHub, w.hubSide.pid())
	}
	for _, c := range w.workloadClusters() {
		apiServer, etcd, err := c.Spoke.Pids()
		if err != nil {
			return nil, err
		}
		add(c.Spoke.Name+" kube-apiserver", SideWorkload, apiServer)
		add(c.Spoke.Name+" etcd", SideWorkload, etcd)
		add("kube-scheduler"+c.logSuffix, SideWorkload, c.scheduler.pid())
		add("kube-controller-manager"+c.logSuffix, SideWorkload, c.controllerManager.pid())
	}
	if w.kubeletSide != nil {
		add("kubelet side (simulated kubelet)", SideWorkload, w.kubeletSide.pid())
	}
	return out, nil
}

// stopSides stops the side processes, the kubelet's first.
func (w *World) stopSides() error {
	var errs []error
	for _, s := range []*sideProcess{w.kubeletSide, w.hubSide} {
		if s != nil {
			errs = append(errs, s.stop(70*time.Second))
		}
	}
	return errors.Join(errs...)
}
