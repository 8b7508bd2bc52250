package manifests

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/capacity"
	"github.com/autonode/karpenter-clusterapi/pkg/controllers/allocatable"
	hubpkg "github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// contractNames are the labels and annotations of the product contract,
// each of which docs/annotations.md must name. The v1alpha1 ones are checked
// for completeness against pkg/apis/v1alpha1/labels.go.
var contractNames = map[string]string{
	"KarpenterMemberLabel":        v1alpha1.KarpenterMemberLabel,
	"MachineAnnotation":           v1alpha1.MachineAnnotation,
	"MachineNamespaceAnnotation":  v1alpha1.MachineNamespaceAnnotation,
	"MachineDeploymentAnnotation": v1alpha1.MachineDeploymentAnnotation,
	"NodeClaimAnnotation":         v1alpha1.NodeClaimAnnotation,
	"PriceAnnotation":             v1alpha1.PriceAnnotation,
	"SpotPriceAnnotation":         v1alpha1.SpotPriceAnnotation,
	"CurrentPriceAnnotation":      v1alpha1.CurrentPriceAnnotation,
	"OfferingAnnotation":          v1alpha1.OfferingAnnotation,
	"InstanceTypeAnnotation":      v1alpha1.InstanceTypeAnnotation,
	"TemplateHashAnnotation":      v1alpha1.TemplateHashAnnotation,
	"BootstrapHashAnnotation":     v1alpha1.BootstrapHashAnnotation,
	"ManagedLabel":                v1alpha1.ManagedLabel,
	"ReservationCountAnnotation":  v1alpha1.ReservationCountAnnotation,
	"ReservationZoneAnnotation":   v1alpha1.ReservationZoneAnnotation,
	"ReservedPriceAnnotation":     v1alpha1.ReservedPriceAnnotation,
	"ReservationIDAnnotation":     v1alpha1.ReservationIDAnnotation,
	"KubeletClientCSRAnnotation":  v1alpha1.KubeletClientCSRAnnotation,
}

// otherNames are further names users meet, from other packages.
var otherNames = []string{
	hubpkg.PendingNodeClaimsAnnotation,
	hubpkg.ReleasedMachinesAnnotation,
	machinedeployment.OwnedReplicasAnnotation,
	machinedeployment.HeldReplicasAnnotation,
	instancetype.MinSizeAnnotation,
	instancetype.MaxSizeAnnotation,
	allocatable.MismatchAnnotation,
	capacity.CPUKey, capacity.MemoryKey, capacity.EphemeralDiskKey, capacity.MaxPodsKey,
	capacity.GPUCountKey, capacity.GPUTypeKey, capacity.LabelsKey, capacity.TaintsKey,
}

// TestDocsNameEveryLabelAndAnnotation keeps docs/annotations.md complete.
func TestDocsNameEveryLabelAndAnnotation(t *testing.T) {
	root := environment.RepoRoot()
	doc := readText(t, filepath.Join(root, "docs", "annotations.md"))
	for _, name := range constNames(t, filepath.Join(root, "pkg", "apis", "v1alpha1", "labels.go")) {
		if _, ok := contractNames[name]; !ok {
			t.Errorf("pkg/apis/v1alpha1/labels.go declares %s: add it to contractNames in this test and to docs/annotations.md", name)
		}
	}
	for _, value := range contractNames {
		if !mentions(doc, value) {
			t.Errorf("docs/annotations.md does not name %s", value)
		}
	}
	for _, value := range otherNames {
		// Capacity keys appear without their common prefix in the table.
		short := strings.TrimPrefix(value, capacity.AnnotationPrefix)
		if !mentions(doc, value) && !mentions(doc, short) {
			t.Errorf("docs/annotations.md does not name %s", value)
		}
	}
}

// TestDocsNameEveryMetric keeps docs/troubleshooting.md's metrics table complete.
func TestDocsNameEveryMetric(t *testing.T) {
	root := environment.RepoRoot()
	doc := readText(t, filepath.Join(root, "docs", "troubleshooting.md"))
	files, _ := filepath.Glob(filepath.Join(root, "pkg", "metrics", "*.go"))
	name := regexp.MustCompile(`Name:\s*"([a-z0-9_]+)"`)
	found := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		for _, m := range name.FindAllStringSubmatch(readText(t, f), -1) {
			found++
			if metric := "karpenter_clusterapi_" + m[1]; !mentions(doc, metric) {
				t.Errorf("docs/troubleshooting.md does not describe the metric %s (%s)", metric, filepath.Base(f))
			}
		}
	}
	if found == 0 {
		t.Error("no metric found in pkg/metrics: has the declaration style changed?")
	}
}

// TestDocLinks: relative links in the documentation point at files that
// exist, and anchors at headings that exist.
func TestDocLinks(t *testing.T) {
	root := environment.RepoRoot()
	var files []string
	for _, pattern := range []string{"README.md", "docs/*.md", "examples/*.md", "examples/*/*.md", "charts/*/README.md"} {
		m, _ := filepath.Glob(filepath.Join(root, pattern))
		files = append(files, m...)
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		for _, m := range link.FindAllStringSubmatch(readText(t, f), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			full := f
			if path != "" {
				full = filepath.Join(filepath.Dir(f), path)
			}
			if _, err := os.Stat(full); err != nil {
				t.Errorf("%s: link %s: %v", rel, target, err)
				continue
			}
			if anchor != "" && strings.HasSuffix(full, ".md") && !hasAnchor(readText(t, full), anchor) {
				t.Errorf("%s: link %s: no heading with that anchor", rel, target)
			}
		}
	}
}

// hasAnchor reports whether markdown text has a heading whose GitHub anchor is a.
func hasAnchor(text, a string) bool {
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		heading := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(heading) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || ('a' <= r && r <= 'z') || ('0' <= r && r <= '9'):
				b.WriteRune(r)
			}
		}
		if b.String() == a {
			return true
		}
	}
	return false
}

// constNames lists the constants a Go file declares.
func constNames(t *testing.T, path string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			for _, n := range s.(*ast.ValueSpec).Names {
				out = append(out, n.Name)
			}
		}
	}
	return out
}

// mentions reports whether text names s as a whole: in backquotes (a
// metric possibly followed by its labels), between spaces or quoted.
func mentions(text, s string) bool {
	return strings.Contains(text, "`"+s+"`") || strings.Contains(text, "`"+s+"{") ||
		strings.Contains(text, " "+s+" ") || strings.Contains(text, strconv.Quote(s))
}

func readText(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
