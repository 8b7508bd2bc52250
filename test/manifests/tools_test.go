package manifests

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// The pinned tools of hack/tools/go.mod, run with `go tool`: Go builds them
// from the module proxy once and caches the binaries.
const (
	kustomizeTool = "sigs.k8s.io/kustomize/kustomize/v5"
	helmTool      = "helm.sh/helm/v3/cmd/helm"
)

var toolBuilds sync.Map // tool -> *toolBuild

type toolBuild struct {
	once sync.Once
	done chan struct{}
	err  error
}

// warmTools starts building both tools in the background.
func warmTools() {
	for _, tool := range []string{kustomizeTool, helmTool} {
		go func() { _ = buildTool(tool) }()
	}
}

// buildTool builds a tool once (later calls wait for the first).
func buildTool(tool string) error {
	v, _ := toolBuilds.LoadOrStore(tool, &toolBuild{done: make(chan struct{})})
	b := v.(*toolBuild)
	b.once.Do(func() {
		defer close(b.done)
		// -n builds the tool into Go's cache and prints where.
		cmd := exec.Command("go", "tool", "-modfile="+toolsModfile(), "-n", tool)
		cmd.Dir = environment.RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("building %s: %w: %s", tool, err, lines(out))
		}
	})
	<-b.done
	return b.err
}

func toolsModfile() string {
	return filepath.Join(environment.RepoRoot(), "hack", "tools", "go.mod")
}

// runTool runs a pinned tool in the repository root and returns its standard
// output.
func runTool(t *testing.T, tool string, args ...string) ([]byte, error) {
	t.Helper()
	if err := buildTool(tool); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", append([]string{"tool", "-modfile=" + toolsModfile(), tool}, args...)...)
	cmd.Dir = environment.RepoRoot()
	home := t.TempDir()
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %v: %w: %s", toolName(tool), args, err, lines(stderr.Bytes()))
	}
	return stdout.Bytes(), nil
}

func toolName(tool string) string {
	if base := filepath.Base(tool); base != "v5" {
		return base
	}
	return "kustomize"
}
