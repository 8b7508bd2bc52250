// Package e2e runs the product end to end: the provider binary, built from
// this repository and started as main.go starts it, against the world of
// test/world (real API servers, real Cluster API controllers, real
// kube-scheduler, simulated AWS and kubelet).
package e2e

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/placement"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// BuildProvider builds the provider binary into dir, with the crash points
// of pkg/failpoint compiled in (the kill tests use them; the shipped binary
// has none).
func BuildProvider(dir string) (string, error) {
	bin := filepath.Join(dir, "karpenter-clusterapi")
	cmd := exec.Command("go", "build", "-tags", "failpoints", "-o", bin, ".")
	cmd.Dir = environment.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the provider: %w: %s", err, out)
	}
	return bin, nil
}

// Provider is a running provider process.
type Provider struct {
	cmd         *exec.Cmd
	LogPath     string
	MetricsPort int
	done        chan struct{}
}

// suiteUnavailableTTL is how long the providers of the tests leave an
// exhausted offering out (production default: 3 minutes).
const suiteUnavailableTTL = 40 * time.Second

// suiteSoleScalerWindow is the shared provider's --sole-scaler-window
// (production default: 15 minutes), short so that a test sees SoleScaler
// turn True again.
const suiteSoleScalerWindow = 45 * time.Second

// StartProvider starts the provider binary against the world, scoped to its
// namespace and Cluster, with extra arguments.
func StartProvider(bin string, w *world.World, logName string, extra ...string) (*Provider, error) {
	return StartProviderWithEnv(bin, w, logName, nil, extra...)
}

// StartProviderWithEnv is StartProvider with extra environment variables.
func StartProviderWithEnv(bin string, w *world.World, logName string, env []string, extra ...string) (*Provider, error) {
	return startProvider(bin, w, w.SpokeKubeconfig, w.ClusterName, logName, env, extra)
}

// StartProviderForCluster starts the provider binary for another Cluster of
// the world (World.AddCluster): its workload cluster, scoped to the world's
// namespace and that Cluster, with extra arguments.
func StartProviderForCluster(bin string, w *world.World, c *world.WorkloadCluster, logName string, extra ...string) (*Provider, error) {
	return startProvider(bin, w, c.SpokeKubeconfig, c.Name, logName, nil, extra)
}

func startProvider(bin string, w *world.World, spokeKubeconfig, clusterName, logName string, env, extra []string) (*Provider, error) {
	args := append([]string{
		"--kubeconfig=" + spokeKubeconfig,
		"--cluster-api-kubeconfig=" + w.HubKubeconfig,
		"--cluster-api-namespace=" + w.Namespace,
		"--cluster-api-cluster-name=" + clusterName,
	}, extra...)
	return startKarpenter(bin, filepath.Join(w.Dir, logName), args, env)
}

// karpenterCPUs pins the Karpenter processes (none: anywhere): the
// workload side's CPUs in the bench's separated placement.
var karpenterCPUs placement.CPUs

// startKarpenter starts a binary built on Karpenter core's operator (this
// provider, or core's kwok provider) with the suite's settings of core,
// metrics and health probes on free ports, and extra environment variables.
func startKarpenter(bin, logPath string, args, env []string) (*Provider, error) {
	metrics, err := freePort()
	if err != nil {
		return nil, err
	}
	health, err := freePort()
	if err != nil {
		return nil, err
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Killed with the test process, as the world's processes are: a bench
	// stopped by hand left its provider retrying a world that was gone, at
	// a third of a core, under the next make test.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Env = append(os.Environ(),
		"DISABLE_LEADER_ELECTION=true",
		fmt.Sprintf("METRICS_PORT=%d", metrics),
		fmt.Sprintf("HEALTH_PROBE_PORT=%d", health),
		"LOG_LEVEL=debug",
		// Decide on pending pods quickly; production defaults are 1s/10s.
		"BATCH_IDLE_DURATION=500ms",
		"BATCH_MAX_DURATION=3s",
		"FEATURE_GATES=NodeOverlay=true",
		// Short enough for a test to see an exhausted offering come back.
		"UNAVAILABLE_OFFERINGS_TTL="+suiteUnavailableTTL.String(),
	)
	cmd.Env = append(cmd.Env, env...)
	if err := placement.Start(cmd, karpenterCPUs); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", filepath.Base(bin), err)
	}
	p := &Provider{cmd: cmd, LogPath: logPath, MetricsPort: metrics, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id of the provider process.
func (p *Provider) Pid() int { return p.cmd.Process.Pid }

// Kill stops the provider abruptly, as a crash or an evicted pod would.
func (p *Provider) Kill() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Stop stops the provider gracefully, then abruptly after a while.
func (p *Provider) Stop() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		p.Kill()
	}
}

// Exited reports whether the process ended.
func (p *Provider) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// WaitFor polls cond every interval until it holds or the timeout passes.
func WaitFor(ctx context.Context, timeout time.Duration, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		ok, err := cond(ctx)
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("timed out after %s: %w", timeout, last)
			}
			return fmt.Errorf("timed out after %s", timeout)
		case <-tick.C:
		}
	}
}

// metricsText fetches the provider's metrics endpoint.
func (p *Provider) metricsText() (string, error) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", p.MetricsPort))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// Metric reads one series, written as the endpoint prints it
// (name{label="value",...} with labels sorted), and whether it is present.
func (p *Provider) Metric(series string) (float64, bool, error) {
	text, err := p.metricsText()
	if err != nil {
		return 0, false, err
	}
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil, err
		}
	}
	return 0, false, nil
}

// Histogram reads a histogram from the provider's metrics endpoint: the
// cumulative count per bucket upper bound, and the total count.
func (p *Provider) Histogram(name string) (map[float64]float64, float64, error) {
	body, err := p.metricsText()
	if err != nil {
		return nil, 0, err
	}
	buckets := map[float64]float64{}
	var count float64
	for _, line := range strings.Split(body, "\n") {
		switch {
		case strings.HasPrefix(line, name+"_bucket{le=\""):
			rest := strings.TrimPrefix(line, name+"_bucket{le=\"")
			le, val, ok := strings.Cut(rest, "\"} ")
			if !ok || le == "+Inf" {
				continue
			}
			bound, err1 := strconv.ParseFloat(le, 64)
			n, err2 := strconv.ParseFloat(strings.TrimSpace(val), 64)
			if err1 == nil && err2 == nil {
				buckets[bound] = n
			}
		case strings.HasPrefix(line, name+"_count "):
			count, _ = strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, name+"_count ")), 64)
		}
	}
	return buckets, count, nil
}

// Quantile is the smallest bucket bound holding at least q of the observations.
func Quantile(buckets map[float64]float64, count, q float64) float64 {
	bounds := make([]float64, 0, len(buckets))
	for b := range buckets {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	for _, b := range bounds {
		if buckets[b] >= q*count {
			return b
		}
	}
	return math.Inf(1)
}
