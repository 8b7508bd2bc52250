package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// docBlock is a fenced code block of a doc marked "<!-- walkthrough: name -->".
type docBlock struct {
	name, script string
}

// walkthroughBlocks reads the marked blocks of a doc, in its order, their
// lines unindented as the list item they sit in indents them.
func walkthroughBlocks(t *testing.T, doc string) []docBlock {
	t.Helper()
	raw, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	var out []docBlock
	for i := 0; i < len(lines); i++ {
		mark := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(mark, "<!-- walkthrough:") {
			continue
		}
		name := strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(mark, "<!-- walkthrough:"), "-->"))
		if i+1 >= len(lines) || !strings.HasPrefix(strings.TrimSpace(lines[i+1]), "```") {
			t.Fatalf("%s:%d: walkthrough block %q is not followed by a fenced block", doc, i+1, name)
		}
		indent := lines[i+1][:len(lines[i+1])-len(strings.TrimLeft(lines[i+1], " "))]
		var script []string
		j := i + 2
		for ; j < len(lines) && strings.TrimSpace(lines[j]) != "```"; j++ {
			script = append(script, strings.TrimPrefix(lines[j], indent))
		}
		out = append(out, docBlock{name: name, script: strings.Join(script, "\n")})
		i = j
	}
	return out
}

// walkthrough runs a doc's blocks with bash in dir, the provider binary on
// the PATH as karpenter-clusterapi, and the doc's settings as env.
type walkthrough struct {
	blocks map[string]string
	order  []string
	dir    string
	env    []string
}

func newWalkthrough(t *testing.T, doc string, settings map[string]string) *walkthrough {
	wt := &walkthrough{blocks: map[string]string{}, dir: t.TempDir()}
	for _, b := range walkthroughBlocks(t, doc) {
		wt.blocks[b.name] = b.script
		wt.order = append(wt.order, b.name)
	}
	binDir := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(binDir, "karpenter-clusterapi")); err != nil {
		t.Fatal(err)
	}
	wt.env = append(os.Environ(), "PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	for k, v := range settings {
		wt.env = append(wt.env, k+"="+v)
	}
	return wt
}

// run runs the named block (override: settings changed for this run) and
// returns its output and error.
func (wt *walkthrough) run(t *testing.T, name string, override ...string) (string, error) {
	t.Helper()
	script, ok := wt.blocks[name]
	if !ok {
		t.Fatalf("the doc has no walkthrough block %q (it has %v)", name, wt.order)
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir, cmd.Env = wt.dir, append(append([]string(nil), wt.env...), override...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("block %q: %w", name, err)
	}
	return out.String(), err
}

// must runs the block and fails the test on an error.
func (wt *walkthrough) must(t *testing.T, name string) string {
	t.Helper()
	out, err := wt.run(t, name)
	if err != nil {
		t.Fatalf("%v\n%s\nscript:\n%s", err, out, wt.blocks[name])
	}
	return out
}
