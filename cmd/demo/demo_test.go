package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The components the demo starts, as /proc/<pid>/comm names them (15 chars).
var wantChildren = []string{"kube-apiserver", "etcd", "kube-scheduler", "kube-controll", "karpenter-clust"}

// demoBin is the demo binary, built once for every test of the package
// (CGO_ENABLED=0, as make demo builds it).
var demoBin string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	if os.Getenv("KUBEBUILDER_ASSETS") != "" {
		dir, err := os.MkdirTemp("", "demo-bin")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		demoBin = filepath.Join(dir, "demo")
		build := exec.Command("go", "build", "-o", demoBin, ".")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building the demo: %v: %s\n", err, out)
			return 1
		}
	}
	return m.Run()
}

// Ctrl-C in a terminal: SIGINT to the demo's whole process group, once the
// table shows a Ready node and both modes have launched a node. Nothing the
// demo started may survive it.
func TestDemoShowsBothModesAndCtrlCLeavesNothing(t *testing.T) {
	d := startDemo(t)
	// The bound is a failure bound, not a speed target: the demo builds the
	// provider at its start, which on a CI machine compiling other test
	// packages at the same time took 2m40s (the README's cold-start figures
	// are measured on an idle machine).
	d.waitReadyNodeAndBothModes(t, 6*time.Minute)
	d.stop(t, -d.cmd.Process.Pid, syscall.SIGINT, true)
}

// make demo DEMO_ARGS=--autonode, as the README's first screen says: the
// AutoNode controller deploys the provider for the labelled Cluster, the
// provider it runs launches nodes in both modes, and Ctrl-C leaves nothing.
func TestDemoAutoNodeRunsTheProviderFromOneLabel(t *testing.T) {
	d := startDemo(t, "--autonode")
	_, at := d.waitLine(t, 6*time.Minute, func(l string) bool { return strings.Contains(l, "AutoNode controller started") })
	t.Logf("AutoNode controller started after %s", at.Round(100*time.Millisecond))
	_, at = d.waitLine(t, 4*time.Minute, func(l string) bool { return strings.Contains(l, "provider started") })
	t.Logf("provider deployed by AutoNode running after %s", at.Round(100*time.Millisecond))
	d.waitReadyNodeAndBothModes(t, 4*time.Minute)
	d.stop(t, -d.cmd.Process.Pid, syscall.SIGINT, true)
}

// However the demo ends, nothing it started is left: SIGTERM to the demo
// alone (kill <pid>), SIGHUP to its process group (the shell's hang-up),
// its terminal closed (the kernel's hang-up to a session), and SIGKILL,
// which the demo cannot handle (its reaper stops the rest). Each case
// starts a demo and stops it once the world and the provider run.
func TestDemoStopsEverythingHoweverItEnds(t *testing.T) {
	t.Run("SIGTERM", func(t *testing.T) {
		d := startDemo(t)
		d.waitStarted(t)
		d.stop(t, d.cmd.Process.Pid, syscall.SIGTERM, true)
	})
	t.Run("SIGHUP", func(t *testing.T) {
		d := startDemo(t)
		d.waitStarted(t)
		d.stop(t, -d.cmd.Process.Pid, syscall.SIGHUP, true)
	})
	t.Run("terminal closed", func(t *testing.T) {
		d, master := startDemoOnTerminal(t)
		d.waitChildren(t, 3*time.Minute)
		d.closeTerminal(t, master)
	})
	t.Run("SIGKILL", func(t *testing.T) {
		d := startDemo(t)
		d.waitStarted(t)
		d.stop(t, d.cmd.Process.Pid, syscall.SIGKILL, false)
	})
}

type demoProcess struct {
	cmd      *exec.Cmd
	start    time.Time
	lines    chan string
	output   []string
	children map[int]string // pid -> comm of every descendant seen
	// exited is closed when the demo on a terminal exits, with exitErr.
	exited  chan struct{}
	exitErr error
}

func startDemo(t *testing.T, args ...string) *demoProcess {
	t.Helper()
	if demoBin == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set (make test sets it)")
	}
	cmd := exec.Command(demoBin, append([]string{"--dir", filepath.Join(t.TempDir(), ".demo"), "--refresh", "1s"}, args...)...)
	cmd.Stderr = os.Stderr
	// A process group of its own, like a shell job: Ctrl-C signals the group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	d := &demoProcess{cmd: cmd, start: time.Now(), lines: make(chan string, 1024), children: map[int]string{}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.cleanup(t)
	go func() {
		defer close(d.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			d.lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	return d
}

// cleanup kills what is left only when the test failed half way: nothing
// may outlive it.
func (d *demoProcess) cleanup(t *testing.T) {
	t.Cleanup(func() {
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		for pid := range d.children {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

// waitLine reads the demo's output until a line satisfies ok.
func (d *demoProcess) waitLine(t *testing.T, timeout time.Duration, ok func(string) bool) (string, time.Duration) {
	t.Helper()
	for _, l := range d.output {
		if ok(l) {
			return l, time.Since(d.start)
		}
	}
	deadline := time.After(timeout)
	for {
		select {
		case line, open := <-d.lines:
			if !open {
				t.Fatalf("the demo ended early:\n%s", strings.Join(d.output, "\n"))
			}
			d.output = append(d.output, line)
			d.noteChildren()
			if ok(line) {
				return line, time.Since(d.start)
			}
		case <-deadline:
			t.Fatalf("no such line after %s:\n%s", timeout, strings.Join(d.output, "\n"))
		}
	}
}

// waitStarted waits until the demo says the provider runs: every component
// is then up.
func (d *demoProcess) waitStarted(t *testing.T) {
	t.Helper()
	_, at := d.waitLine(t, 3*time.Minute, func(l string) bool { return strings.Contains(l, "provider started") })
	t.Logf("world and provider up after %s", at.Round(100*time.Millisecond))
}

// waitRow reads the demo's output until a table row satisfies ok, noting the
// demo's descendants meanwhile; it returns the row and when it came.
func (d *demoProcess) waitRow(t *testing.T, timeout time.Duration, ok func(fields []string) bool) (string, time.Duration) {
	t.Helper()
	return d.waitLine(t, timeout, func(line string) bool {
		f := strings.Fields(line)
		return len(f) == 8 && f[0] != ">" && strings.Contains(f[6], "/") && ok(f)
	})
}

// stop signals pid (a negative pid: the group) and checks that the demo
// ends (cleanly, when graceful) and every process it started is gone.
func (d *demoProcess) stop(t *testing.T, pid int, sig syscall.Signal, graceful bool) {
	t.Helper()
	d.noteChildren()
	d.checkChildrenSeen(t)
	start := time.Now()
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() {
		for line := range d.lines {
			d.output = append(d.output, line)
		}
		exited <- d.cmd.Wait()
	}()
	select {
	case err := <-exited:
		if graceful && err != nil {
			t.Errorf("the demo exited with %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the demo did not exit within 2m of %s:\n%s", sig, strings.Join(d.output, "\n"))
	}
	t.Logf("%s: the demo exited after %s", sig, time.Since(start).Round(100*time.Millisecond))
	if last := d.output[len(d.output)-1]; graceful && !strings.Contains(last, "stopped everything the demo started") {
		t.Errorf("last line %q, want the stop confirmation", last)
	}
	d.checkNoneLeft(t, start)
}

// checkChildrenSeen makes sure the check after the stop proves something.
func (d *demoProcess) checkChildrenSeen(t *testing.T) {
	t.Helper()
	for _, want := range wantChildren {
		found := false
		for _, comm := range d.children {
			found = found || strings.HasPrefix(comm, want)
		}
		if !found {
			t.Errorf("no %s among the demo's processes %v: the check below would prove nothing", want, d.children)
		}
	}
}

// checkNoneLeft waits (briefly: a killed process group takes a moment to
// go) until no descendant the demo had is alive.
func (d *demoProcess) checkNoneLeft(t *testing.T, since time.Time) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var left []string
		for pid, comm := range d.children {
			if alive(pid, comm) {
				left = append(left, fmt.Sprintf("%s (pid %d)", comm, pid))
			}
		}
		if len(left) == 0 {
			t.Logf("no process of the demo left %s after the signal", time.Since(since).Round(100*time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("survived the demo: %s", strings.Join(left, ", "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// noteChildren records every live descendant of the demo.
func (d *demoProcess) noteChildren() {
	parents := map[int]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _, ok := stat(pid); ok {
			parents[pid] = ppid
		}
	}
	for pid := range parents {
		for p := parents[pid]; p > 1; p = parents[p] {
			if p == d.cmd.Process.Pid {
				d.children[pid] = comm(pid)
				break
			}
		}
	}
}

// alive: the pid runs (not a zombie) and is still the same program.
func alive(pid int, name string) bool {
	_, state, ok := stat(pid)
	return ok && state != "Z" && comm(pid) == name
}

func stat(pid int) (ppid int, state string, ok bool) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, "", false
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	i := strings.LastIndex(string(data), ") ")
	if i < 0 {
		return 0, "", false
	}
	f := strings.Fields(string(data)[i+2:])
	if len(f) < 2 {
		return 0, "", false
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[0], err == nil
}

func comm(pid int) string {
	data, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
	return strings.TrimSpace(string(data))
}

// waitReadyNodeAndBothModes waits for a table row with a Ready node (within
// timeout) and then for a launch shown in each mode.
func (d *demoProcess) waitReadyNodeAndBothModes(t *testing.T, timeout time.Duration) {
	t.Helper()
	row, elapsed := d.waitRow(t, timeout, func(f []string) bool {
		ready, _, _ := strings.Cut(f[6], "/")
		n, err := strconv.Atoi(ready)
		return err == nil && n > 0
	})
	t.Logf("first Ready node after %s: %q", elapsed.Round(100*time.Millisecond), row)
	for _, mode := range []string{"[MD] NodeClaim", "[Machine] NodeClaim"} {
		line, at := d.waitLine(t, 3*time.Minute, func(l string) bool { return strings.Contains(l, mode) && strings.Contains(l, "launched") })
		t.Logf("%s launch shown after %s: %q", mode, at.Round(100*time.Millisecond), strings.TrimSpace(line))
	}
}
