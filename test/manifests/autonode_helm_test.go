package manifests

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

const autonodeChartDir = "charts/karpenter-clusterapi-autonode"

// TestAutoNodeHelmChart renders the AutoNode chart and applies it with
// server-side dry-run to a management cluster: the controller's rules are
// the generated ones (config/rbac/autonode), the hub ClusterRole it binds
// is config/rbac/hub's, and the Deployment runs the autonode subcommand.
func TestAutoNodeHelmChart(t *testing.T) {
	out, err := runTool(t, helmTool, "template", "autonode", autonodeChartDir, "--namespace", "karpenter-autonode",
		"--set", "image.tag=v9.9.9", "--set", "logLevel=debug")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatal(err)
	}
	ensureNamespace(t, hub, "karpenter-autonode")
	for _, obj := range objs {
		if err := applyDryRun(hub, obj, "karpenter-autonode"); err != nil {
			t.Error(err)
		}
	}
	checkRules(t, objs, "ClusterRole", "-autonode", generatedRules(t, "config/rbac/autonode/role.yaml"))
	checkRules(t, objs, "ClusterRole", "-hub", generatedRules(t, "config/rbac/hub/role.yaml"))
	checkRules(t, objs, "Role", "-autonode", generatedRoleRules(t, "config/rbac/autonode/role.yaml"))
	deployments := find(objs, "Deployment")
	if len(deployments) != 1 {
		t.Fatalf("%d Deployments", len(deployments))
	}
	d := &appsv1.Deployment{}
	convert(t, deployments[0], d)
	args := d.Spec.Template.Spec.Containers[0].Args
	for _, want := range []string{"autonode", "--version=v9.9.9", "--provider-image=ghcr.io/autonode/karpenter-clusterapi:v9.9.9", "--zap-log-level=debug"} {
		if !slices.Contains(args, want) {
			t.Errorf("args %v lack %s", args, want)
		}
	}
	if n := len(find(objs, "CustomResourceDefinition")); n != 0 {
		t.Errorf("%d CRDs: they belong in the workload clusters", n)
	}
}

// generatedRoleRules are the rules of the Role in a generated file.
func generatedRoleRules(t *testing.T, rel string) []rbacv1.PolicyRule {
	t.Helper()
	objs, err := decode(readFile(t, rel))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "Role" {
			role := &rbacv1.Role{}
			raw, _ := yaml.Marshal(o.Object)
			if err := yaml.Unmarshal(raw, role); err != nil {
				t.Fatal(err)
			}
			return role.Rules
		}
	}
	t.Fatalf("%s has no Role", rel)
	return nil
}

func readFile(t *testing.T, rel string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(environment.RepoRoot(), rel))
	if err != nil {
		t.Fatal(err)
	}
	return data
}
