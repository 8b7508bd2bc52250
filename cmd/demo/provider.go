package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/autonode/karpenter-clusterapi/test/world"
)

// buildProvider builds the provider binary from the repository, as `make build` does.
func buildProvider(ctx context.Context, root, bin string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = root
	// CGO_ENABLED=0 as `make demo` builds the demo: the provider's packages
	// are then the demo's, compiled once.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	// go build runs the compiler in children: a process group of its own,
	// all stopped when the demo stops, and killed if the demo is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the provider: %w: %s", err, out)
	}
	return nil
}

// provider is the provider binary running against the world, in a process
// group of its own that dies with the demo.
type provider struct {
	cmd         *exec.Cmd
	logPath     string
	metricsPort int
	done        <-chan struct{}
	// stopAll, when set, stops what runs the provider instead (AutoNode:
	// its controller and the pod runner).
	stopAll    func()
	startedPid int
}

// startProvider runs the provider as main.go runs in the topology where it
// lives beside the workload cluster: the spoke's kubeconfig, the hub's, and
// the Cluster's namespace and name.
func startProvider(bin string, w *world.World, logPath string) (*provider, error) {
	metrics, err := freePort()
	if err != nil {
		return nil, err
	}
	health, err := freePort()
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin,
		"--kubeconfig="+w.SpokeKubeconfig,
		"--cluster-api-kubeconfig="+w.HubKubeconfig,
		"--cluster-api-namespace="+w.Namespace,
		"--cluster-api-cluster-name="+w.ClusterName,
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(),
		"DISABLE_LEADER_ELECTION=true",
		fmt.Sprintf("METRICS_PORT=%d", metrics),
		fmt.Sprintf("HEALTH_PROBE_PORT=%d", health),
	)
	// Its own process group: a Ctrl-C in the terminal reaches the demo, which
	// stops the provider before the clusters it talks to.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting the provider: %w", err)
	}
	done := make(chan struct{})
	p := &provider{cmd: cmd, logPath: logPath, metricsPort: metrics, done: done}
	go func() {
		_ = cmd.Wait()
		_ = logFile.Close()
		close(done)
	}()
	return p, nil
}

func (p *provider) pid() int {
	if p.cmd == nil {
		return p.startedPid
	}
	return p.cmd.Process.Pid
}

// newProviderOf is a provider process that something else started.
func newProviderOf(pid int, logPath string, metricsPort int, done <-chan struct{}, stopAll func()) *provider {
	return &provider{startedPid: pid, logPath: logPath, metricsPort: metricsPort, done: done, stopAll: stopAll}
}

func (p *provider) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the provider's process group, SIGKILL after 20 s.
func (p *provider) stop() {
	if p.stopAll != nil {
		p.stopAll()
		return
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
		<-p.done
	}
}

// metrics returns the provider's Prometheus metrics text.
func (p *provider) metrics(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", p.metricsPort), nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
