package main

import (
	"bufio"
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

// Ctrl-C in a terminal: SIGINT to the demo's whole process group, once the
// table shows a Ready node. The first Ready node must show within 2 minutes,
// and nothing the demo started may survive it.
func TestDemoShowsReadyNodesAndCtrlCLeavesNothing(t *testing.T) {
	d := startDemo(t)
	row, elapsed := d.waitRow(t, 3*time.Minute, func(f []string) bool {
		ready, _, _ := strings.Cut(f[6], "/")
		n, err := strconv.Atoi(ready)
		return err == nil && n > 0
	})
	t.Logf("first Ready node after %s: %q", elapsed.Round(100*time.Millisecond), row)
	if elapsed > 2*time.Minute {
		t.Errorf("the first Ready node showed after %s, want within 2m", elapsed)
	}
	d.stop(t, -d.cmd.Process.Pid, syscall.SIGINT)
}

// SIGTERM to the demo alone (kill <pid>) stops everything the same way.
func TestDemoSIGTERMLeavesNothing(t *testing.T) {
	d := startDemo(t)
	d.waitRow(t, 3*time.Minute, func([]string) bool { return true })
	d.stop(t, d.cmd.Process.Pid, syscall.SIGTERM)
}

type demoProcess struct {
	cmd      *exec.Cmd
	start    time.Time
	lines    chan string
	output   []string
	children map[int]string // pid -> comm of every descendant seen
}

func startDemo(t *testing.T) *demoProcess {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set (make test sets it)")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "demo")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the demo: %v: %s", err, out)
	}
	cmd := exec.Command(bin, "--dir", filepath.Join(dir, ".demo"), "--refresh", "1s")
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
	t.Cleanup(func() {
		// Only when the test failed half way: nothing may outlive it.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		for pid := range d.children {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
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

// waitRow reads the demo's output until a table row satisfies ok, noting the
// demo's descendants meanwhile; it returns the row and when it came.
func (d *demoProcess) waitRow(t *testing.T, timeout time.Duration, ok func(fields []string) bool) (string, time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case line, open := <-d.lines:
			if !open {
				t.Fatalf("the demo ended early:\n%s", strings.Join(d.output, "\n"))
			}
			d.output = append(d.output, line)
			d.noteChildren()
			f := strings.Fields(line)
			if len(f) == 8 && f[0] != ">" && strings.Contains(f[6], "/") && ok(f) {
				return line, time.Since(d.start)
			}
		case <-deadline:
			t.Fatalf("no such table row after %s:\n%s", timeout, strings.Join(d.output, "\n"))
		}
	}
}

// stop signals pid (a negative pid: the group) and checks that the demo
// ends cleanly and every process it started is gone.
func (d *demoProcess) stop(t *testing.T, pid int, sig syscall.Signal) {
	t.Helper()
	d.noteChildren()
	for _, want := range wantChildren {
		found := false
		for _, comm := range d.children {
			found = found || strings.HasPrefix(comm, want)
		}
		if !found {
			t.Errorf("no %s among the demo's processes %v: the check below would prove nothing", want, d.children)
		}
	}
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
		if err != nil {
			t.Errorf("the demo exited with %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the demo did not exit within 2m of %s:\n%s", sig, strings.Join(d.output, "\n"))
	}
	t.Logf("%s: the demo exited after %s", sig, time.Since(start).Round(100*time.Millisecond))
	if last := d.output[len(d.output)-1]; !strings.Contains(last, "stopped everything the demo started") {
		t.Errorf("last line %q, want the stop confirmation", last)
	}
	for pid, comm := range d.children {
		if alive(pid, comm) {
			t.Errorf("%s (pid %d) survived the demo", comm, pid)
		}
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
