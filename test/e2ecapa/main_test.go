// Package e2ecapa runs the product end to end against Cluster API Provider
// AWS's real controllers: the provider binary, the world of test/world with
// CAPA's manager (built by hack/capa-bin.sh from CAPA's own module) in place
// of the simulated CAPA, and a simulated EC2 (test/world/ec2sim) behind
// CAPA's --service-endpoints. What the provider reads from CAPA's objects
// (failure reasons, conditions, spot options, template capacity) is what
// CAPA itself wrote here, from EC2 answers with EC2's own error codes.
//
// It is its own package so that `go test ./...` runs it in parallel with
// test/e2e. CAPA_BIN names the CAPA binary; without it, TestMain runs
// hack/capa-bin.sh (cached after the first build).
package e2ecapa

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/autonode/karpenter-clusterapi/test/e2e"
	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

var (
	w        *world.World
	provider *e2e.Provider
)

func TestMain(m *testing.M) {
	flag.Parse()
	// The scenarios mostly wait on controllers (CAPA takes a minute to let a
	// deleted AWSMachine go): run them all at once, not GOMAXPROCS at a time.
	if f := flag.Lookup("test.parallel"); f != nil && f.Value.String() == f.DefValue {
		_ = flag.Set("test.parallel", "16")
	}
	os.Exit(run(m))
}

// capaBinary returns CAPA_BIN or builds (first time) the cached binary.
func capaBinary() (string, error) {
	if bin := os.Getenv("CAPA_BIN"); bin != "" {
		return bin, nil
	}
	cmd := exec.Command(filepath.Join(environment.RepoRoot(), "hack", "capa-bin.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/capa-bin.sh: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}

func run(m *testing.M) int {
	ctrl.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	dir, err := os.MkdirTemp("", "e2ecapa-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	built := make(chan error, 1)
	var bin string
	go func() {
		var err error
		bin, err = e2e.BuildProvider(dir)
		built <- err
	}()
	capa, err := capaBinary()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t0 := time.Now()
	w, err = world.Start(ctx, world.Options{
		// Instances take a few seconds to boot, as on EC2 (where it is
		// tens of seconds); terminations as long.
		ProvisionDelay: 3 * time.Second,
		CAPA:           &world.CAPAOptions{Binary: capa, ShuttingDownFor: 2 * time.Second},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the world with the real CAPA:", err)
		return 1
	}
	defer w.Stop()
	fmt.Fprintf(os.Stderr, "world with the real CAPA started in %s\n", time.Since(t0).Round(time.Second))
	if err := <-built; err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	provider, err = e2e.StartProvider(bin, w, "provider.log")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { provider.Stop() }()
	code := m.Run()
	if live := w.EC2.Live(); code == 0 && len(live) > 0 {
		fmt.Fprintf(os.Stderr, "%d EC2 instances left running after the tests: %+v\n", len(live), live)
		code = 1
	}
	// The AWS actions CAPA called, for the record of what its path is.
	fmt.Fprintf(os.Stderr, "AWS actions CAPA called: %v; refused launches by code: %v\n", w.EC2.Calls(), w.EC2.LaunchErrorCodes())
	if unknown := w.EC2.UnknownActions(); len(unknown) > 0 {
		// CAPA called an AWS action nobody simulated: its path differs from
		// what these tests assume.
		fmt.Fprintf(os.Stderr, "CAPA called actions the simulator does not implement: %v\n", unknown)
		code = 1
	}
	if code != 0 {
		w.KeepDir = true
		fmt.Fprintf(os.Stderr, "logs: provider %s; world %v\n", provider.LogPath, w.LogFiles())
	}
	return code
}

// fullSuite skips a scenario outside the full suite: `make test` runs the
// CI subset (scale up and down, insufficient-capacity fallback, both
// modes); `make test-capa` (E2E_CAPA_ALL=1) runs every scenario.
func fullSuite(t *testing.T) {
	t.Helper()
	if os.Getenv("E2E_CAPA_ALL") == "" {
		t.Skip("not in the CI subset: run `make test-capa` (E2E_CAPA_ALL=1)")
	}
}
