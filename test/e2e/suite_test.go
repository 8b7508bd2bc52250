package e2e

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

	"github.com/autonode/karpenter-clusterapi/test/world"
)

var (
	w        *world.World
	bin      string
	provider *Provider
)

func TestMain(m *testing.M) {
	world.RunSideIfAsked() // the side processes of a split world (BENCH_PLACEMENT)
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrl.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	built := make(chan error, 1)
	go func() {
		// E2E_PROVIDER_BIN runs the suite against another build (say, an
		// earlier commit's from hack/provider-at.sh, to see a scenario fail
		// without the work it accepts).
		if other := os.Getenv("E2E_PROVIDER_BIN"); other != "" {
			bin = other
			built <- nil
			return
		}
		var err error
		bin, err = BuildProvider(dir)
		built <- err
	}()
	opts, err := suitePlacement()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	w, err = world.Start(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the world:", err)
		return 1
	}
	defer w.Stop()
	if err := <-built; err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	provider, err = StartProviderWithEnv(bin, w, "provider.log", []string{"SOLE_SCALER_WINDOW=" + suiteSoleScalerWindow.String()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { provider.Stop() }()
	code := m.Run()
	if code == 0 && panicked(provider.LogPath) {
		// controller-runtime recovers reconciler panics: a test can pass
		// while the provider panicked on some object. It must never.
		fmt.Fprintln(os.Stderr, "the provider panicked during the tests (\"Observed a panic\" in its log)")
		code = 1
	}
	if code != 0 || os.Getenv("E2E_KEEP_LOGS") != "" {
		w.KeepDir = true
		fmt.Fprintf(os.Stderr, "logs: provider %s; world %v\n", provider.LogPath, w.LogFiles())
		if os.Getenv("E2E_KEEP_LOGS") == "" {
			dumpTail(provider.LogPath, 200)
		}
	}
	return code
}

// panicked reports whether the provider log records a recovered panic.
func panicked(path string) bool {
	data, err := os.ReadFile(path)
	return err == nil && strings.Contains(string(data), "Observed a panic")
}

func dumpTail(path string, lines int) {
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	all := splitLines(string(data))
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	fmt.Fprintf(os.Stderr, "---- last %d lines of %s ----\n", len(all), path)
	for _, l := range all {
		fmt.Fprintln(os.Stderr, l)
	}
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}
