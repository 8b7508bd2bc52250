package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// heartbeat is how long the demo stays silent while the envtest binaries build.
const heartbeat = 15 * time.Second

// ensureEnvtestAssets makes sure KUBEBUILDER_ASSETS names the API server,
// etcd, scheduler and controller manager binaries. On the first run
// hack/envtest-bins.sh builds them (about 8 minutes on 2 cores); its progress
// and a heartbeat are shown meanwhile.
func ensureEnvtestAssets(ctx context.Context, root string, say func(string, ...any)) error {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "kube-apiserver")); err == nil {
			say("envtest binaries: %s", dir)
			return nil
		}
	}
	say("envtest binaries: running hack/envtest-bins.sh (cached after the first run, which builds them: about 8 minutes on 2 cores)")
	cmd := exec.Command(filepath.Join(root, "hack", "envtest-bins.sh"))
	cmd.Dir = root
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("hack/envtest-bins.sh: %w", err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	start := time.Now()
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	var last string
	for done := false; !done; {
		select {
		case line, ok := <-lines:
			if !ok {
				done = true
				break
			}
			// envtest-bins.sh's own progress lines; go's download chatter is summarised by the heartbeat.
			if strings.HasPrefix(line, "envtest-bins:") {
				say("%s", line)
			}
			last = line
		case <-tick.C:
			say("still building the envtest binaries, %s so far (last: %s)", time.Since(start).Round(time.Second), truncate(last, 80))
		case <-ctx.Done():
			// SIGTERM lets the script remove its work directory; SIGKILL if it lingers.
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-exited
			}
			return ctx.Err()
		}
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("hack/envtest-bins.sh: %w (last output: %s)", err, last)
	}
	out := strings.Fields(stdout.String())
	if len(out) == 0 {
		return fmt.Errorf("hack/envtest-bins.sh printed no directory")
	}
	dir := out[len(out)-1]
	say("envtest binaries: %s (built in %s)", dir, time.Since(start).Round(time.Second))
	return os.Setenv("KUBEBUILDER_ASSETS", dir)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
