package caconvert

import (
	"fmt"
	"sort"
	"strings"
)

// FindingKind says what became of a setting.
type FindingKind string

const (
	// Mapped: carried over, the message says to what.
	Mapped FindingKind = "mapped"
	// NotCarried: this provider or Karpenter has no equivalent; the message
	// says why and what comes closest.
	NotCarried FindingKind = "not-carried"
	// Skipped: the node group was not converted (bad input); the message
	// names the field and what to fix.
	Skipped FindingKind = "skipped"
	// Todo: a step left to the user.
	Todo FindingKind = "todo"
)

// Finding is one line of the report.
type Finding struct {
	// Object is "<Kind> <namespace>/<name>", or a setting such as
	// "--expander".
	Object string
	// Field is the annotation key or setting concerned, when there is one.
	Field   string
	Kind    FindingKind
	Message string
}

func (f Finding) String() string {
	field := ""
	if f.Field != "" {
		field = " " + f.Field
	}
	return fmt.Sprintf("[%s] %s%s: %s", f.Kind, f.Object, field, f.Message)
}

func sortFindings(fs []Finding) {
	order := map[FindingKind]int{Skipped: 0, NotCarried: 1, Todo: 2, Mapped: 3}
	sort.SliceStable(fs, func(i, j int) bool {
		if order[fs[i].Kind] != order[fs[j].Kind] {
			return order[fs[i].Kind] < order[fs[j].Kind]
		}
		if fs[i].Object != fs[j].Object {
			return fs[i].Object < fs[j].Object
		}
		return fs[i].Field < fs[j].Field
	})
}

// Report renders the findings as comment lines, for the top of a manifest.
func Report(fs []Finding) string {
	var b strings.Builder
	b.WriteString("# Converted from cluster-autoscaler by karpenter-clusterapi " + Command + ".\n")
	if len(fs) == 0 {
		b.WriteString("# No node group found (no MachineDeployment or MachineSet with both size annotations).\n")
	}
	for _, f := range fs {
		b.WriteString("# " + strings.ReplaceAll(f.String(), "\n", " ") + "\n")
	}
	return b.String()
}
