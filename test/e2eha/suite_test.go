// Package e2eha runs the provider as two replicas with leader election
// against the world of test/world and breaks them: the leader killed in the
// middle of a burst, a graceful handover, the workload cluster's API server
// down for two minutes. It has its own world so that `go test ./...` runs
// it beside test/e2e.
package e2eha

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/autonode/karpenter-clusterapi/test/e2e"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

var (
	w   *world.World
	bin string
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrl.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "e2eha-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	built := make(chan error, 1)
	go func() {
		var err error
		bin, err = e2e.BuildProvider(dir)
		built <- err
	}()
	w, err = world.Start(ctx, world.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the world:", err)
		return 1
	}
	defer w.Stop()
	if err := <-built; err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	if code != 0 {
		w.KeepDir = true
		fmt.Fprintf(os.Stderr, "logs in %s: %v\n", w.Dir, w.LogFiles())
	}
	return code
}

// panicked reports whether a provider log records a recovered panic
// (controller-runtime recovers reconciler panics; the provider must never).
func panicked(paths []string) string {
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(data), "Observed a panic") {
			return p
		}
	}
	return ""
}
