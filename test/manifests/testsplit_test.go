package manifests

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// make test runs test/e2e as several processes (hack/test.sh): each Test
// function of the package must run in exactly one of them, whatever the
// number of shards and whether its duration is recorded.
func TestE2EShardsRunEveryTestOnce(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	want := e2eTests(t, filepath.Join(root, "test", "e2e"))
	if len(want) < 10 {
		t.Fatalf("found only %d tests in test/e2e: %v", len(want), want)
	}
	for _, shards := range []string{"1", "2", "3"} {
		cmd := exec.Command("bash", filepath.Join(root, "hack", "test.sh"))
		cmd.Env = append(os.Environ(), "E2E_LIST=1", "E2E_SHARDS="+shards)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("E2E_SHARDS=%s hack/test.sh: %v", shards, err)
		}
		patterns := strings.Fields(string(out))
		if got, n := len(patterns), shards; strconv.Itoa(got) != n {
			t.Fatalf("E2E_SHARDS=%s: %d patterns, want %s: %q", shards, got, shards, out)
		}
		runs := map[string]int{}
		for _, p := range patterns {
			re, err := regexp.Compile(p)
			if err != nil {
				t.Fatalf("E2E_SHARDS=%s: pattern %q: %v", shards, p, err)
			}
			for _, name := range want {
				if re.MatchString(name) {
					runs[name]++
				}
			}
		}
		for _, name := range want {
			if runs[name] != 1 {
				t.Errorf("E2E_SHARDS=%s: %s runs in %d shards, want 1", shards, name, runs[name])
			}
		}
	}
}

// e2eTests parses the package's test files for its Test functions.
func e2eTests(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	fset := token.NewFileSet()
	for _, f := range files {
		parsed, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range parsed.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Name.Name == "TestMain" {
				continue
			}
			names = append(names, fn.Name.Name)
		}
	}
	slices.Sort(names)
	return names
}
