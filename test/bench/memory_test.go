package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// BenchmarkResidentMemory10k measures the resident memory of the provider
// binary, built from this repository and run as main.go runs it, with
// 10,000 Machines and 500 MachineDeployments in its (scoped) hub namespace.
//
// The package's TestMain keeps its API servers to itself, so this benchmark
// starts its own hub and spoke and fills the hub with populate, the same
// 10,000 Machines and 500 MachineDeployments the other benchmarks read.
// It waits for the provider's /readyz, then until its RSS has stopped
// growing (its Machine informer has listed), and reports VmRSS and VmHWM from
// /proc/<pid>/status. Target: RSS <= 300 MiB.
func BenchmarkResidentMemory10k(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := b.TempDir()

	built := make(chan error, 1)
	bin := filepath.Join(dir, "karpenter-clusterapi")
	go func() {
		cmd := exec.Command("go", "build", "-o", bin, ".")
		cmd.Dir = environment.RepoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			err = fmt.Errorf("building the provider: %w: %s", err, out)
		}
		built <- err
	}()
	hubEnv, err := environment.StartHub()
	if err != nil {
		b.Fatal(err)
	}
	defer hubEnv.Stop()
	spokeEnv, err := environment.StartSpoke()
	if err != nil {
		b.Fatal(err)
	}
	defer spokeEnv.Stop()
	saved := mdList
	defer func() { mdList = saved }() // populate appends to the shared list
	mdList = nil
	start := time.Now()
	if err := populate(ctx, hubEnv.Client, spokeEnv.Client); err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "memory: created %d Machines and %d MachineDeployments in %s\n", machineCount, machineDeployments, time.Since(start).Round(time.Second))
	if err := <-built; err != nil {
		b.Fatal(err)
	}
	hubKubeconfig, err := hubEnv.WriteKubeconfig(dir)
	if err != nil {
		b.Fatal(err)
	}
	spokeKubeconfig, err := spokeEnv.WriteKubeconfig(dir)
	if err != nil {
		b.Fatal(err)
	}
	metricsPort, healthPort := freePort(b), freePort(b)
	logPath := filepath.Join(dir, "provider.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(bin,
		"--kubeconfig="+spokeKubeconfig,
		"--cluster-api-kubeconfig="+hubKubeconfig,
		"--cluster-api-namespace="+namespace,
		"--cluster-api-cluster-name="+clusterName,
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(os.Environ(),
		"DISABLE_LEADER_ELECTION=true",
		fmt.Sprintf("METRICS_PORT=%d", metricsPort),
		fmt.Sprintf("HEALTH_PROBE_PORT=%d", healthPort),
	)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}()
	fail := func(format string, args ...any) {
		b.Helper()
		tail, _ := os.ReadFile(logPath)
		if len(tail) > 4000 {
			tail = tail[len(tail)-4000:]
		}
		b.Fatalf(format+"\n---- provider log tail ----\n%s", append(args, tail)...)
	}

	started := time.Now()
	for {
		select {
		case <-exited:
			fail("the provider exited")
		default:
		}
		if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort)); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Since(started) > 2*time.Minute {
			fail("the provider was not ready after 2m")
		}
		time.Sleep(200 * time.Millisecond)
	}
	ready := time.Since(started)
	// Ready does not wait for every informer: wait until the provider's
	// machinedeployment controller, which watches the hub's Machines and
	// MachineDeployments, starts its workers (controller-runtime starts them
	// once those informers have listed), then at least 10s more and until
	// RSS has not grown by more than 1 MiB for 5s. Measure before the
	// provider's 30s orphan grace ends: these Machines' NodeClaims do not
	// exist in the spoke, so it then starts giving them back.
	for !workersStarted(logPath, "machinedeployment") {
		select {
		case <-exited:
			fail("the provider exited")
		default:
		}
		if time.Since(started) > 3*time.Minute {
			fail("the provider's machinedeployment controller did not start within 3m")
		}
		time.Sleep(200 * time.Millisecond)
	}
	listed := time.Since(started)
	var rss, hwm float64
	stableSince, settleStart := time.Now(), time.Now()
	for {
		cur, peak, err := procMemory(cmd.Process.Pid)
		if err != nil {
			fail("reading the provider's memory: %v", err)
		}
		if cur > rss+1 {
			stableSince = time.Now()
		}
		rss, hwm = max(rss, cur), peak
		if time.Since(settleStart) >= 10*time.Second && time.Since(stableSince) >= 5*time.Second {
			break
		}
		if time.Since(settleStart) > 20*time.Second {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	rss, hwm, err = procMemory(cmd.Process.Pid)
	if err != nil {
		fail("reading the provider's memory: %v", err)
	}
	b.ReportMetric(rss, "rss-MiB")
	b.ReportMetric(hwm, "peak-rss-MiB")
	b.ReportMetric(0, "ns/op")
	fmt.Printf("provider resident memory with %d Machines and %d MachineDeployments in the hub: VmRSS %.0f MiB, VmHWM %.0f MiB (ready after %s, controller started after %s, measured %s later); target RSS <= 300 MiB\n",
		machineCount, machineDeployments, rss, hwm, ready.Round(time.Millisecond), listed.Round(time.Millisecond), time.Since(settleStart).Round(time.Second))
}

// workersStarted reports whether the provider logged that a controller
// started its workers.
func workersStarted(logPath, controller string) bool {
	data, err := os.ReadFile(logPath)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, `"message":"Starting workers"`) && strings.Contains(line, `"controller":"`+controller+`"`) {
			return true
		}
	}
	return false
}

// procMemory reads VmRSS and VmHWM of a process, in MiB.
func procMemory(pid int) (rss, hwm float64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		key, val, ok := strings.Cut(s.Text(), ":")
		if !ok || (key != "VmRSS" && key != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %w", s.Text(), err)
		}
		if key == "VmRSS" {
			rss = kb / 1024
		} else {
			hwm = kb / 1024
		}
	}
	return rss, hwm, s.Err()
}

func freePort(b *testing.B) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
