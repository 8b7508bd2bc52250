package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// reaperFlag runs this binary as the reaper of a demo (see startReaper).
const reaperFlag = "--reaper"

// reaper is a second process that outlives the demo for one purpose: when
// the demo ends without stopping what it started (SIGKILL, a crash, an OOM
// kill), it kills every process group the demo registered. envtest starts
// etcd and kube-apiserver in process groups of their own and without a
// parent-death signal, so nothing else would stop them.
//
// Protocol on the reaper's stdin: one process group ID per line to watch;
// "done" when the demo has stopped everything itself. Either way, at "done"
// or at the end of input (the demo died), the reaper kills what is left of
// the groups and exits: after "done" nothing should be left, but a failed
// start can leave a process behind (envtest does not always stop a
// kube-apiserver that timed out starting).
type reaper struct {
	mu      sync.Mutex
	w       io.WriteCloser
	cmd     *exec.Cmd
	watched map[int]bool
}

// startReaper starts the reaper in a process group of its own, so that the
// terminal's signals (Ctrl-C, hang-up) reach the demo, not it.
func startReaper() (*reaper, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, reaperFlag)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	w, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the reaper: %w", err)
	}
	return &reaper{w: w, cmd: cmd, watched: map[int]bool{}}, nil
}

// watchDescendants registers the process groups of every descendant of the
// demo, now and every interval until ctx ends.
func (r *reaper) watchDescendants(ctx context.Context, interval time.Duration) {
	for {
		for _, pid := range descendants(os.Getpid()) {
			if pid == r.cmd.Process.Pid {
				continue
			}
			if pgid, err := syscall.Getpgid(pid); err == nil && pgid != syscall.Getpgrp() {
				r.watch(pgid)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

func (r *reaper) watch(pgid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.watched[pgid] {
		return
	}
	r.watched[pgid] = true
	_, _ = fmt.Fprintf(r.w, "%d\n", pgid)
}

// release tells the reaper the demo stopped everything it could, and waits
// for it to kill what is left and exit.
func (r *reaper) release() {
	r.mu.Lock()
	_, _ = fmt.Fprintln(r.w, "done")
	_ = r.w.Close()
	r.mu.Unlock()
	_ = r.cmd.Wait()
}

// runReaper is the reaper process's main.
func runReaper(in io.Reader) {
	signalIgnore()
	var groups []int
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "done" {
			break
		}
		if pgid, err := strconv.Atoi(line); err == nil && pgid > 1 {
			groups = append(groups, pgid)
		}
	}
	for _, pgid := range groups {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
}

// signalIgnore keeps the reaper alive through the signals meant for the
// demo (a Ctrl-C or hang-up sent to every process of the session).
func signalIgnore() {
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP)
}

// descendants lists the live descendants of pid, from /proc.
func descendants(pid int) []int {
	parents := map[int]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		i := strings.LastIndex(string(data), ") ")
		if i < 0 {
			continue
		}
		f := strings.Fields(string(data)[i+2:])
		if len(f) < 2 || f[0] == "Z" {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			parents[p] = ppid
		}
	}
	var out []int
	for p := range parents {
		for q := parents[p]; q > 1; q = parents[q] {
			if q == pid {
				out = append(out, p)
				break
			}
		}
	}
	return out
}
