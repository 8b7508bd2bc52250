package manifests

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// overlay says where a kustomize overlay is applied and what it must hold.
type overlay struct {
	// toHub: the management cluster; else the workload cluster.
	toHub bool
	// namespaces the overlay installs into, created before the apply.
	namespaces []string
	check      func(t *testing.T, objs []*unstructured.Unstructured)
}

var overlays = map[string]overlay{
	"workload-cluster": {
		namespaces: []string{"karpenter"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			checkDeployment(t, objs, deploymentExpectations{topology: inWorkloadCluster, metricsPort: 8080, healthPort: 8081})
			checkRules(t, objs, "ClusterRole", "-workload", generatedRules(t, "config/rbac/workload/role.yaml"))
			checkRules(t, objs, "ClusterRole", "-core", generatedRules(t, "config/rbac/workload/core_role.yaml"))
			checkCRDs(t, objs)
			checkNoCSRApprover(t, objs)
		},
	},
	"hub-access": {
		toHub:      true,
		namespaces: []string{"default"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			checkRules(t, objs, "Role", "-hub", generatedRules(t, "config/rbac/hub/role.yaml"))
			checkNamespaceOnly(t, objs)
		},
	},
	"hub-access-all-namespaces": {
		toHub:      true,
		namespaces: []string{"karpenter"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			checkRules(t, objs, "ClusterRole", "-hub", generatedRules(t, "config/rbac/hub/role.yaml"))
		},
	},
	"autonode": {
		toHub:      true,
		namespaces: []string{"karpenter-autonode"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			checkRules(t, objs, "ClusterRole", "-autonode", generatedRules(t, "config/rbac/autonode/role.yaml"))
			checkRules(t, objs, "ClusterRole", "-hub", generatedRules(t, "config/rbac/hub/role.yaml"))
			if n := len(find(objs, "ClusterRoleBinding")); n != 1 {
				t.Errorf("%d ClusterRoleBindings, want only the AutoNode controller's: nobody holds the hub rules cluster-wide", n)
			}
			if n := len(find(objs, "CustomResourceDefinition")); n != 0 {
				t.Errorf("%d CRDs: they belong in the workload clusters", n)
			}
		},
	},
	"management-cluster": {
		toHub:      true,
		namespaces: []string{"default"},
		check: func(t *testing.T, objs []*unstructured.Unstructured) {
			checkDeployment(t, objs, deploymentExpectations{topology: inManagementCluster, metricsPort: 8080, healthPort: 8081})
			checkRules(t, objs, "Role", "-hub", generatedRules(t, "config/rbac/hub/role.yaml"))
		},
	},
}

// TestKustomizeOverlays renders every overlay under config/overlays with the
// pinned kustomize and applies the result with server-side dry-run to the
// cluster it is for.
func TestKustomizeOverlays(t *testing.T) {
	dir := filepath.Join(environment.RepoRoot(), "config", "overlays")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		name := e.Name()
		seen[name] = true
		t.Run(name, func(t *testing.T) {
			o, ok := overlays[name]
			if !ok {
				t.Fatalf("config/overlays/%s: add it to this test's overlays table (where it is applied, what it must hold)", name)
			}
			out, err := runTool(t, kustomizeTool, "build", filepath.Join("config", "overlays", name))
			if err != nil {
				t.Fatal(err)
			}
			objs, err := decode(out)
			if err != nil {
				t.Fatal(err)
			}
			target := spoke
			if o.toHub {
				target = hub
			}
			for _, ns := range o.namespaces {
				ensureNamespace(t, target, ns)
			}
			for _, obj := range objs {
				if err := applyDryRun(target, obj, ""); err != nil {
					t.Error(err)
				}
			}
			o.check(t, objs)
		})
	}
	for name := range overlays {
		if !seen[name] {
			t.Errorf("overlay %s is in the test's table but not under config/overlays", name)
		}
	}
}

// checkNamespaceOnly: nothing cluster-scoped, so the credential reaches one namespace.
func checkNamespaceOnly(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		if o.GetNamespace() == "" {
			t.Errorf("%s is cluster-scoped: a scoped provider's hub access must stay in the Cluster's namespace", describe(o))
		}
	}
}

// checkCRDs: the workload cluster gets the NodeClass CRD and Karpenter's.
func checkCRDs(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	have := map[string]bool{}
	for _, o := range find(objs, "CustomResourceDefinition") {
		have[o.GetName()] = true
	}
	for _, want := range []string{
		"clusterapinodeclasses.karpenter.cluster.x-k8s.io",
		"nodepools.karpenter.sh", "nodeclaims.karpenter.sh", "nodeoverlays.karpenter.sh",
	} {
		if !have[want] {
			t.Errorf("CRD %s missing", want)
		}
	}
}

func sarComponent(sar bool, rel func(...string) string) string {
	if !sar {
		return ""
	}
	return "- " + rel("config", "components", "kubelet-csr-subjectaccessreview") + "\n"
}

// TestKustomizeApproveKubeletCSRs renders the workload-cluster overlay with
// the approve-kubelet-csrs component, as docs/install.md says to add it:
// the flag's variable is set, the approval rules are exactly the generated
// ones, bound to the provider's ServiceAccount in the overlay's namespace.
func TestKustomizeApproveKubeletCSRs(t *testing.T) {
	for _, sar := range []bool{false, true} {
		t.Run(fmt.Sprintf("subjectaccessreview=%v", sar), func(t *testing.T) { kustomizeApproveKubeletCSRs(t, sar) })
	}
}

// kustomizeApproveKubeletCSRs: with sar, the kubelet-csr-subjectaccessreview
// component too.
func kustomizeApproveKubeletCSRs(t *testing.T, sar bool) {
	root := environment.RepoRoot()
	dir := t.TempDir()
	// kustomize takes a kustomization's resources by relative path only.
	rel := func(parts ...string) string {
		r, err := filepath.Rel(dir, filepath.Join(append([]string{root}, parts...)...))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	kustomization := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" +
		"resources:\n- " + rel("config", "overlays", "workload-cluster") + "\n" +
		"components:\n- " + rel("config", "components", "approve-kubelet-csrs") + "\n" + sarComponent(sar, rel) +
		// The overlay's own namespace transformer, which runs after its
		// components when the component is listed in the overlay itself.
		"transformers:\n- " + rel("config", "overlays", "workload-cluster", "namespace.yaml") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runTool(t, kustomizeTool, "build", "--load-restrictor", "LoadRestrictionsNone", dir)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatal(err)
	}
	ensureNamespace(t, spoke, "karpenter")
	for _, obj := range objs {
		if err := applyDryRun(spoke, obj, ""); err != nil {
			t.Error(err)
		}
	}
	checkRules(t, objs, "ClusterRole", "-csr-approver", generatedRules(t, "config/rbac/csr-approver/role.yaml"))
	checkBound(t, objs, "-csr-approver", "karpenter")
	checkEnv(t, objs, map[string]string{"APPROVE_KUBELET_CSRS": "true"})
	if sar {
		checkRules(t, objs, "ClusterRole", "-csr-approver-sar", generatedRules(t, "config/rbac/csr-approver-sar/role.yaml"))
		checkBound(t, objs, "-csr-approver-sar", "karpenter")
		checkEnv(t, objs, map[string]string{"KUBELET_CSR_BOOTSTRAP_AUTHORIZATION": "subjectaccessreview"})
	}
}
