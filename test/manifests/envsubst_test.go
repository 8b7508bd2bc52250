package manifests

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// variable matches clusterctl's variable forms: ${VAR}, ${VAR:=default},
// ${VAR:-default}, ${VAR=default} and ${VAR-default}.
var variable = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[=-])([^}]*))?\}`)

// envsubst substitutes clusterctl variables in text as clusterctl does for
// these forms. It returns the names of variables that have neither a value
// nor a default.
func envsubst(text string, vars map[string]string) (string, []string) {
	missing := map[string]bool{}
	out := variable.ReplaceAllStringFunc(text, func(m string) string {
		g := variable.FindStringSubmatch(m)
		name, op, def := g[1], g[2], g[3]
		value, set := vars[name]
		switch op {
		case "":
			if !set {
				missing[name] = true
			}
			return value
		case ":=", ":-":
			if !set || value == "" {
				return def
			}
		case "=", "-":
			if !set {
				return def
			}
		}
		return value
	})
	names := make([]string, 0, len(missing))
	for n := range missing {
		names = append(names, n)
	}
	sort.Strings(names)
	return out, names
}

// requiredVariables lists the variables used without a default.
func requiredVariables(text string) []string {
	seen := map[string]bool{}
	for _, g := range variable.FindAllStringSubmatch(text, -1) {
		if g[2] == "" {
			seen[g[1]] = true
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func TestEnvsubst(t *testing.T) {
	vars := map[string]string{"A": "a", "EMPTY": ""}
	for _, c := range []struct{ in, want, missing string }{
		{"${A}", "a", ""},
		{"x-${A}-y", "x-a-y", ""},
		{"${B}", "", "B"},
		{"${B:=3}", "3", ""},
		{"${B:-3}", "3", ""},
		{"${A:=3}", "a", ""},
		{"${EMPTY:=3}", "3", ""},
		{"${EMPTY=3}", "", ""},
		{"${B=3}", "3", ""},
		{"${A}${B}${C:=c}", "ac", "B"},
		{"{{ ds.meta_data.local_hostname }}", "{{ ds.meta_data.local_hostname }}", ""},
	} {
		got, missing := envsubst(c.in, vars)
		if got != c.want || strings.Join(missing, ",") != c.missing {
			t.Errorf("envsubst(%q) = %q, missing %v; want %q, missing %q", c.in, got, missing, c.want, c.missing)
		}
	}
	if got := fmt.Sprint(requiredVariables("${A} ${B:=1} ${C} ${A}")); got != "[A C]" {
		t.Errorf("requiredVariables = %s, want [A C]", got)
	}
}
