package cloudprovider

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/autonode/karpenter-clusterapi/"

// The two modes are siblings behind launch.Mode: neither imports the
// other, and the cloud provider imports neither (it dispatches through the
// interface; the operator wires the modes in).
func TestModesAreSiblingsBehindOneInterface(t *testing.T) {
	deps := func(pkg string) map[string]bool {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", module+pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		set := map[string]bool{}
		for _, l := range strings.Fields(string(out)) {
			set[l] = true
		}
		return set
	}
	for _, c := range []struct{ pkg, mustNot string }{
		{"pkg/machinedeployment", "pkg/machine"},
		{"pkg/machine", "pkg/machinedeployment"},
		{"pkg/cloudprovider", "pkg/machine"},
		{"pkg/cloudprovider", "pkg/machinedeployment"},
	} {
		if deps(c.pkg)[module+c.mustNot] {
			t.Errorf("%s depends on %s", c.pkg, c.mustNot)
		}
	}
}
