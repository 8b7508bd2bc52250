package environment

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	_ "github.com/autonode/karpenter-clusterapi/pkg/apis" // registers the types in client-go's scheme
)

// Cluster is one running API server with a client.
type Cluster struct {
	Name   string
	Env    *envtest.Environment
	Config *rest.Config
	Client client.Client

	mu sync.Mutex
	// apiServerArgs is the command line of the API server envtest started,
	// kept by KillAPIServer for RestartAPIServer.
	apiServerArgs []string
	// restarted is the API server RestartAPIServer started, which envtest
	// does not know about; Stop stops it.
	restarted *exec.Cmd
	// restartedDone is closed when restarted exits.
	restartedDone chan struct{}
}

// Start starts an API server with the given CRDs installed. It needs
// KUBEBUILDER_ASSETS (make test sets it; `make envtest` prints it).
// configure may change the environment before it starts, e.g. add API
// server flags through env.ControlPlane.GetAPIServer().Configure().
func Start(name string, crds []*apiextensionsv1.CustomResourceDefinition, configure ...func(*envtest.Environment)) (*Cluster, error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return nil, fmt.Errorf("KUBEBUILDER_ASSETS is not set: run the tests with 'make test', or export KUBEBUILDER_ASSETS=$(hack/envtest-bins.sh)")
	}
	env := &envtest.Environment{
		CRDs:                  crds,
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme.Scheme,
	}
	if os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT") == "" {
		// envtest gives etcd and the API server 20 s each, then starts them
		// again (5 times), leaving the slow one running: on 2 cores with
		// several worlds starting (make test's packages in parallel,
		// conformance -parallel) the API server missed that five times.
		env.ControlPlaneStartTimeout = 2 * time.Minute
	}
	for _, f := range configure {
		f(env)
	}
	cfg, err := env.Start()
	if err != nil {
		// envtest leaves what it started running when the start times out.
		_ = env.Stop()
		return nil, fmt.Errorf("starting %s API server: %w", name, err)
	}
	cfg.QPS, cfg.Burst = 500, 1000
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	return &Cluster{Name: name, Env: env, Config: cfg, Client: c}, nil
}

// StartHub starts a management cluster with the Cluster API and CAPA CRDs.
func StartHub(configure ...func(*envtest.Environment)) (*Cluster, error) {
	crds, err := HubCRDs()
	if err != nil {
		return nil, err
	}
	return Start("hub", crds, configure...)
}

// StartSpoke starts a workload cluster with the Karpenter and NodeClass CRDs.
func StartSpoke(configure ...func(*envtest.Environment)) (*Cluster, error) {
	crds, err := SpokeCRDs()
	if err != nil {
		return nil, err
	}
	return Start("spoke", crds, configure...)
}

// Stop stops the API server.
func (c *Cluster) Stop() error {
	if c == nil || c.Env == nil {
		return nil
	}
	c.mu.Lock()
	restarted, done := c.restarted, c.restartedDone
	c.restarted = nil
	c.mu.Unlock()
	var errs []error
	if restarted != nil {
		// envtest's own process is gone; stop the one RestartAPIServer started
		// as envtest would (SIGTERM, then SIGKILL after its stop timeout).
		_ = restarted.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = restarted.Process.Kill()
			<-done
		}
	}
	// Stops etcd (and envtest's API server unless it was killed).
	errs = append(errs, c.Env.Stop())
	return errors.Join(errs...)
}

// KillAPIServer kills the API server process with SIGKILL, as a crash or a
// lost machine would: clients see refused connections at once, whereas a
// graceful stop waits up to a minute for them. etcd keeps running. Start it
// again with RestartAPIServer.
func (c *Cluster) KillAPIServer() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.restarted != nil {
		if err := c.restarted.Process.Kill(); err != nil {
			return fmt.Errorf("killing %s API server: %w", c.Name, err)
		}
		<-c.restartedDone
		// Same command line for the next RestartAPIServer (killed twice or more).
		c.apiServerArgs = append([]string{c.restarted.Path}, c.restarted.Args[1:]...)
		c.restarted = nil
		return nil
	}
	if c.apiServerArgs != nil {
		return fmt.Errorf("%s API server is not running", c.Name)
	}
	pid, args, err := c.findAPIServer()
	if err != nil {
		return err
	}
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	if err := p.Kill(); err != nil {
		return fmt.Errorf("killing %s API server (pid %d): %w", c.Name, pid, err)
	}
	// envtest waits for its child; wait until the process is gone.
	deadline := time.Now().Add(10 * time.Second)
	for processAlive(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s API server (pid %d) still running 10s after SIGKILL", c.Name, pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.apiServerArgs = args
	return nil
}

// RestartAPIServer starts the API server KillAPIServer killed again, with
// the same command line: same address and port, certificates, users and
// etcd. It returns once the API server is ready.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.apiServerArgs == nil || c.restarted != nil {
		return fmt.Errorf("%s API server was not killed", c.Name)
	}
	cmd := exec.Command(c.apiServerArgs[0], c.apiServerArgs[1:]...)
	// Die with the test process, like envtest's own processes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("restarting %s API server: %w", c.Name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	c.restarted, c.restartedDone = cmd, done

	rc, err := rest.UnversionedRESTClientFor(rawRESTConfig(c.Config))
	if err != nil {
		return err
	}
	for {
		select {
		case <-done:
			c.restarted = nil
			return fmt.Errorf("%s API server exited after its restart", c.Name)
		default:
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := rc.Get().AbsPath("/readyz").DoRaw(rctx)
		cancel()
		if err == nil {
			c.apiServerArgs = nil
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s API server to be ready after its restart: %w (last: %v)", c.Name, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func rawRESTConfig(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.GroupVersion = nil
	cfg.APIPath = ""
	cfg.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	return cfg
}

// Pids are the process ids of this cluster's kube-apiserver and etcd.
func (c *Cluster) Pids() (apiServer, etcd int, err error) {
	c.mu.Lock()
	restarted, killed := c.restarted, c.apiServerArgs != nil
	c.mu.Unlock()
	switch {
	case restarted != nil:
		apiServer = restarted.Process.Pid
	case killed: // down for now: no API server
	default:
		if apiServer, _, err = c.findAPIServer(); err != nil {
			return 0, 0, err
		}
	}
	if c.Env.ControlPlane.Etcd == nil || c.Env.ControlPlane.Etcd.URL == nil {
		return apiServer, 0, fmt.Errorf("%s: etcd has no client URL", c.Name)
	}
	etcd, _, err = c.findChild("etcd", "--listen-client-urls="+c.Env.ControlPlane.Etcd.URL.String())
	return apiServer, etcd, err
}

// findAPIServer finds this cluster's kube-apiserver among this process's
// children by its secure port, and returns its pid and command line.
func (c *Cluster) findAPIServer() (int, []string, error) {
	u, err := url.Parse(c.Config.Host)
	if err != nil {
		return 0, nil, err
	}
	return c.findChild("kube-apiserver", "--secure-port="+u.Port())
}

// findChild finds the child of this process running binary with flag (an
// exact argument) and returns its pid and command line.
func (c *Cluster) findChild(binary, flag string) (int, []string, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, nil, fmt.Errorf("finding %s API server: %w", c.Name, err)
	}
	me := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue
		}
		args := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")
		if filepath.Base(args[0]) != binary || !slices.Contains(args, flag) || parentOf(pid) != me {
			continue
		}
		return pid, args, nil
	}
	return 0, nil, fmt.Errorf("%s %s (%s) not found among the processes of pid %d", c.Name, binary, flag, me)
}

func parentOf(pid int) int {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...; comm may contain spaces.
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

func processAlive(pid int) bool {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	// A zombie (Z) is dead: its parent has not reaped it yet.
	return i >= 0 && !strings.HasPrefix(strings.TrimSpace(s[i+1:]), "Z")
}

// WriteKubeconfig writes a kubeconfig for this cluster into dir and returns its path.
func (c *Cluster) WriteKubeconfig(dir string) (string, error) {
	data, err := KubeconfigBytes(c.Config, c.Name)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, c.Name+".kubeconfig")
	return path, os.WriteFile(path, data, 0o600)
}

// KubeconfigBytes renders a rest.Config as a kubeconfig file.
func KubeconfigBytes(cfg *rest.Config, name string) ([]byte, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthorityData: cfg.CAData,
	}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData,
		ClientKeyData:         cfg.KeyData,
		Token:                 cfg.BearerToken,
	}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	kc.CurrentContext = name
	return clientcmd.Write(*kc)
}
