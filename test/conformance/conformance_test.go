package conformance

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// TestConformanceCI runs the CI groups of Karpenter's own suites (Group.CI,
// without their CISkip specs) in both modes, as `make conformance` runs
// every group: a regression in what Karpenter's authors check shows in
// `make test` at once. Its first run builds the suite binaries
// (hack/conformance-bins.sh, cached outside the repository).
func TestConformanceCI(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS must name the envtest binaries: run through `make test` or hack/envtest-bins.sh")
	}
	ctrl.SetLogger(logr.Discard())
	root := environment.RepoRoot()
	start := time.Now()
	cmd := exec.Command(filepath.Join(root, "hack", "conformance-bins.sh"))
	cmd.Dir = root
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("hack/conformance-bins.sh: %v\n%s", err, stderr.String())
	}
	fields := strings.Fields(stdout.String())
	suites := fields[len(fields)-1]
	t.Logf("suite binaries in %s (%s)", suites, time.Since(start).Round(time.Second))

	out, err := os.MkdirTemp("", "conformance-ci-")
	if err != nil {
		t.Fatal(err)
	}
	provider := filepath.Join(out, "karpenter-clusterapi")
	build := exec.Command("go", "build", "-o", provider, ".")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the provider: %v: %s", err, b)
	}
	groups, err := SelectGroups("", true)
	if err != nil {
		t.Fatal(err)
	}
	for i := range groups {
		if groups[i].CISkip != "" {
			groups[i].Skips = append(groups[i].Skips, groups[i].CISkip)
		}
		groups[i].Modes = groups[i].CIModes
	}
	// A deadline before go test's own, and SIGINT/SIGTERM, stop the run the
	// way it stops at the end: suite, provider and world (API servers) too.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 40*time.Minute)
	defer cancel()
	r, err := Run(ctx, Options{
		Modes: Modes, Groups: groups, SuiteDir: suites, ProviderBin: provider, OutDir: out,
		Progress: testWriter{t}, Commit: "make test",
	})
	if r != nil {
		var text bytes.Buffer
		r.WriteText(&text)
		t.Logf("\n%s", text.String())
	}
	if err != nil {
		t.Fatalf("conformance run: %v (logs in %s)", err, out)
	}
	if r.Summary.Failed > 0 || r.Summary.Passed == 0 {
		t.Fatalf("%s (logs in %s)", r.Summary.Line(), out)
	}
	_ = os.RemoveAll(out)
}

// testWriter sends progress lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
