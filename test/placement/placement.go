// Package placement runs processes on chosen CPUs, as a deployment puts
// the management cluster and the workload cluster on different machines:
// the side-by-side bench gives each side of the world a CPU set of its own
// (see test/world's Options.Split).
//
// A process started from a thread inherits that thread's CPU affinity, and
// every thread it makes inherits it in turn. Start and Do therefore pin only
// the calling OS thread, for the time of the fork, and restore it after: the
// Go runtime makes its new threads from an unpinned thread, so nothing else
// of the calling process moves.
package placement

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// CPUs is a set of CPU numbers; empty means "wherever the kernel likes".
type CPUs []int

// Parse reads a CPU list as the kernel prints it: "0", "1,3", "0-2,5".
func Parse(s string) (CPUs, error) {
	var out CPUs
	for _, part := range strings.Split(strings.TrimSpace(s), ",") {
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || a < 0 || b < a || b >= maskBits {
			return nil, fmt.Errorf("CPU list %q: %q is no CPU number or range", s, part)
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// String prints the set as the kernel does ("0-1", "3").
func (c CPUs) String() string {
	var parts []string
	for i := 0; i < len(c); {
		j := i
		for j+1 < len(c) && c[j+1] == c[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(c[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", c[i], c[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// maskBits is the size of the affinity mask this package passes (1 024
// CPUs, glibc's cpu_set_t).
const maskBits = 1024

type mask [maskBits / 64]uint64

func (c CPUs) mask() mask {
	var m mask
	for _, cpu := range c {
		m[cpu/64] |= 1 << (uint(cpu) % 64)
	}
	return m
}

func (m *mask) cpus() CPUs {
	var out CPUs
	for cpu := range maskBits {
		if m[cpu/64]&(1<<(uint(cpu)%64)) != 0 {
			out = append(out, cpu)
		}
	}
	return out
}

// setAffinity pins one thread (tid; 0: the calling one).
func setAffinity(tid int, m mask) error {
	_, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, uintptr(tid), unsafe.Sizeof(m), uintptr(unsafe.Pointer(&m)))
	if errno != 0 {
		return errno
	}
	return nil
}

func getAffinity(tid int) (mask, error) {
	var m mask
	_, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_GETAFFINITY, uintptr(tid), unsafe.Sizeof(m), uintptr(unsafe.Pointer(&m)))
	if errno != 0 {
		return m, errno
	}
	return m, nil
}

// Do runs f on an OS thread pinned to cpus, so that the processes f starts
// (and only they) run there; with no cpus it just runs f. f must start its
// processes from its own goroutine, as exec.Cmd.Start does.
func Do(cpus CPUs, f func() error) error {
	if len(cpus) == 0 {
		return f()
	}
	runtime.LockOSThread()
	old, err := getAffinity(0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("reading the CPU affinity: %w", err)
	}
	if err := setAffinity(0, cpus.mask()); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("pinning to CPUs %s: %w", cpus, err)
	}
	ferr := f()
	if err := setAffinity(0, old); err != nil {
		// The thread stays pinned: leave it locked so that the runtime
		// retires it with this goroutine instead of reusing it. A process
		// started with a parent-death signal would get it then: say so.
		return fmt.Errorf("restoring the CPU affinity after pinning to %s (processes started with Pdeathsig may be killed): %w", cpus, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// Start starts cmd on cpus (none: anywhere).
func Start(cmd *exec.Cmd, cpus CPUs) error {
	return Do(cpus, cmd.Start)
}

// PinProcess pins every thread of process pid to cpus; threads it makes
// later inherit the pin from the thread that makes them. It passes until a
// round finds no thread left to pin, so that threads made meanwhile are
// caught too.
func PinProcess(pid int, cpus CPUs) error {
	if len(cpus) == 0 {
		return nil
	}
	m := cpus.mask()
	done := map[int]bool{}
	for round := 0; round < 10; round++ {
		tids, err := threads(pid)
		if err != nil {
			return err
		}
		pinned := 0
		for _, tid := range tids {
			if done[tid] {
				continue
			}
			if err := setAffinity(tid, m); err != nil && err != syscall.ESRCH {
				return fmt.Errorf("pinning thread %d of process %d to CPUs %s: %w", tid, pid, cpus, err)
			}
			done[tid] = true
			pinned++
		}
		if pinned == 0 {
			return nil
		}
	}
	return fmt.Errorf("process %d kept making threads while it was pinned to CPUs %s", pid, cpus)
}

func threads(pid int) ([]int, error) {
	entries, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return nil, fmt.Errorf("listing the threads of process %d: %w", pid, err)
	}
	var out []int
	for _, e := range entries {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, tid)
		}
	}
	return out, nil
}

// Of returns the CPUs the threads of process pid may run on, and an error
// when its threads disagree (a process pinned after some threads escaped).
func Of(pid int) (CPUs, error) {
	tids, err := threads(pid)
	if err != nil {
		return nil, err
	}
	var first CPUs
	for i, tid := range tids {
		m, err := getAffinity(tid)
		if err == syscall.ESRCH {
			continue // the thread ended meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("reading the CPU affinity of thread %d of process %d: %w", tid, pid, err)
		}
		cpus := m.cpus()
		if i == 0 || first == nil {
			first = cpus
			continue
		}
		if !slices.Equal(cpus, first) {
			return nil, fmt.Errorf("process %d: thread %d may run on CPUs %s, another on %s", pid, tid, cpus, first)
		}
	}
	return first, nil
}

// Online returns the CPUs this process may run on now.
func Online() (CPUs, error) {
	m, err := getAffinity(0)
	if err != nil {
		return nil, err
	}
	return m.cpus(), nil
}
