package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// openPTY opens a pseudo-terminal pair: the master the test holds (a
// terminal emulator's side) and the slave the demo gets as its terminal.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	var n uint32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); errno != 0 {
		t.Fatalf("TIOCGPTN: %v", errno)
	}
	var unlock int32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); errno != 0 {
		t.Fatalf("TIOCSPTLCK: %v", errno)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("opening the pty slave: %v", err)
	}
	return m, s
}

// startDemoOnTerminal runs the demo as a terminal runs a login shell's
// command: in a session of its own whose controlling terminal is a pty.
func startDemoOnTerminal(t *testing.T) (*demoProcess, *os.File) {
	t.Helper()
	if demoBin == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set (make test sets it)")
	}
	master, slave := openPTY(t)
	cmd := exec.Command(demoBin, "--dir", filepath.Join(t.TempDir(), ".demo"), "--refresh", "1s")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	d := &demoProcess{cmd: cmd, start: time.Now(), lines: make(chan string), children: map[int]string{}, exited: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.exitErr = cmd.Wait(); close(d.exited) }()
	_ = slave.Close()
	d.cleanup(t)
	// A terminal keeps reading what the program writes; the last of it is
	// shown when the test fails.
	screen := &tail{}
	go func() { _, _ = io.Copy(screen, master) }()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the demo's terminal, last output:\n%s", screen.String())
		}
	})
	return d, master
}

// waitChildren waits until every component the demo starts runs.
func (d *demoProcess) waitChildren(t *testing.T, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		d.noteChildren()
		seen := 0
		for _, want := range wantChildren {
			for _, comm := range d.children {
				if len(comm) >= len(want) && comm[:len(want)] == want {
					seen++
					break
				}
			}
		}
		if seen == len(wantChildren) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s the demo runs %v, want all of %v", timeout, d.children, wantChildren)
		}
		select {
		case <-d.exited:
			t.Fatalf("the demo exited (%v) before it had started everything", d.exitErr)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// closeTerminal closes the terminal's side of the pty, as closing a
// terminal window does: the kernel hangs up the session (SIGHUP to its
// leader, the demo, and to the foreground process group). The demo must
// exit on its own, cleanly, leaving nothing.
func (d *demoProcess) closeTerminal(t *testing.T, master *os.File) {
	t.Helper()
	d.checkChildrenSeen(t)
	start := time.Now()
	if err := master.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.exited:
		if d.exitErr != nil {
			t.Errorf("the demo exited with %v after its terminal closed", d.exitErr)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the demo did not exit within 2m of its terminal closing")
	}
	t.Logf("terminal closed: the demo exited after %s", time.Since(start).Round(100*time.Millisecond))
	d.checkNoneLeft(t, start)
}

// tail keeps the last 4 KiB written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (b *tail) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > 4096 {
		b.buf = b.buf[len(b.buf)-4096:]
	}
	return len(p), nil
}

func (b *tail) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
