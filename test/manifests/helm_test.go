package manifests

import (
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

const chartDir = "charts/karpenter-clusterapi"

// helmCase is one rendering of the chart.
type helmCase struct {
	name      string
	namespace string
	set       []string
	toHub     bool
	check     func(t *testing.T, objs []*unstructured.Unstructured)
}

var helmCases = []helmCase{{
	name:      "workload cluster, scoped",
	namespace: "karpenter",
	set:       []string{"clusterAPI.namespace=my-cluster", "clusterAPI.clusterName=my-cluster"},
	check: func(t *testing.T, objs []*unstructured.Unstructured) {
		checkDeployment(t, objs, deploymentExpectations{topology: inWorkloadCluster, metricsPort: 8080, healthPort: 8081})
		checkRules(t, objs, "ClusterRole", "-workload", generatedRules(t, "config/rbac/workload/role.yaml"))
		checkRules(t, objs, "ClusterRole", "-core", generatedRules(t, "config/rbac/workload/core_role.yaml"))
		checkCRDs(t, objs)
		checkEnv(t, objs, map[string]string{"CLUSTER_API_NAMESPACE": "my-cluster", "CLUSTER_API_CLUSTER_NAME": "my-cluster", "INSTALL_WORKLOAD_CRDS": "false"})
		checkNoCSRApprover(t, objs)
	},
}, {
	name:      "workload cluster, approves kubelet CSRs",
	namespace: "karpenter",
	set:       []string{"approveKubeletCSRs=true"},
	check: func(t *testing.T, objs []*unstructured.Unstructured) {
		checkRules(t, objs, "ClusterRole", "-csr-approver", generatedRules(t, "config/rbac/csr-approver/role.yaml"))
		checkBound(t, objs, "-csr-approver", "karpenter")
		checkEnv(t, objs, map[string]string{"APPROVE_KUBELET_CSRS": "true", "KUBELET_CSR_BOOTSTRAP_AUTHORIZATION": "identities"})
		for _, o := range objs {
			if strings.HasSuffix(o.GetName(), "-csr-approver-sar") {
				t.Errorf("%s %s rendered without kubeletCSRBootstrapAuthorization=subjectaccessreview", o.GetKind(), o.GetName())
			}
		}
	},
}, {
	name:      "workload cluster, approves kubelet CSRs by SubjectAccessReview",
	namespace: "karpenter",
	set: []string{"approveKubeletCSRs=true", "kubeletCSRBootstrapAuthorization=subjectaccessreview",
		"kubeletCSRBootstrapServiceAccounts={machine-config/node-bootstrapper,ops/joiner}", "kubeletCSRServingExternalAddresses=true"},
	check: func(t *testing.T, objs []*unstructured.Unstructured) {
		checkRules(t, objs, "ClusterRole", "-csr-approver-sar", generatedRules(t, "config/rbac/csr-approver-sar/role.yaml"))
		checkBound(t, objs, "-csr-approver-sar", "karpenter")
		checkEnv(t, objs, map[string]string{"KUBELET_CSR_BOOTSTRAP_AUTHORIZATION": "subjectaccessreview",
			"KUBELET_CSR_BOOTSTRAP_SERVICE_ACCOUNTS": "machine-config/node-bootstrapper,ops/joiner", "KUBELET_CSR_SERVING_EXTERNAL_ADDRESSES": "true"})
	},
}, {
	name:      "workload cluster, installs CRDs, feature gates, own ports",
	namespace: "karpenter",
	set: []string{"installWorkloadCRDs=true", "featureGates.NodeOverlay=true", "featureGates.SpotToSpotConsolidation=false",
		"metrics.port=9090", "healthProbe.port=9091", "replicas=3", "logLevel=debug",
		"leaderElection.leaseDuration=15s", "leaderElection.renewDeadline=10s", "leaderElection.retryPeriod=2s"},
	check: func(t *testing.T, objs []*unstructured.Unstructured) {
		checkDeployment(t, objs, deploymentExpectations{topology: inWorkloadCluster, metricsPort: 9090, healthPort: 9091})
		checkEnv(t, objs, map[string]string{"INSTALL_WORKLOAD_CRDS": "true", "FEATURE_GATES": "NodeOverlay=true,SpotToSpotConsolidation=false", "LOG_LEVEL": "debug",
			"LEADER_ELECTION_LEASE_DURATION": "15s", "LEADER_ELECTION_RENEW_DEADLINE": "10s", "LEADER_ELECTION_RETRY_PERIOD": "2s"})
	},
}, {
	name:      "management cluster",
	namespace: "my-cluster",
	toHub:     true,
	set:       []string{"topology=management-cluster", "clusterAPI.clusterName=my-cluster"},
	check: func(t *testing.T, objs []*unstructured.Unstructured) {
		checkDeployment(t, objs, deploymentExpectations{topology: inManagementCluster, metricsPort: 8080, healthPort: 8081})
		checkRules(t, objs, "Role", "-hub", generatedRules(t, "config/rbac/hub/role.yaml"))
		checkNoCSRApprover(t, objs)
	},
}, {
	name:      "management cluster, approves kubelet CSRs",
	namespace: "my-cluster",
	toHub:     true,
	set:       []string{"topology=management-cluster", "clusterAPI.clusterName=my-cluster", "approveKubeletCSRs=true"},
	check: func(t *testing.T, objs []*unstructured.Unstructured) {
		// Cluster API's kubeconfig of the workload cluster approves already:
		// no RBAC in the management cluster for it.
		checkEnv(t, objs, map[string]string{"APPROVE_KUBELET_CSRS": "true"})
		for _, o := range objs {
			if strings.HasSuffix(o.GetName(), "-csr-approver") {
				t.Errorf("%s %s rendered in the management cluster", o.GetKind(), o.GetName())
			}
		}
	},
}, {
	name:      "hub access, scoped",
	namespace: "my-cluster",
	toHub:     true,
	set:       []string{"hubAccessOnly=true", "clusterAPI.namespace=my-cluster"},
	check: func(t *testing.T, objs []*unstructured.Unstructured) {
		checkRules(t, objs, "Role", "-hub", generatedRules(t, "config/rbac/hub/role.yaml"))
		checkNamespaceOnly(t, objs)
		if got := kinds(objs); got["Deployment"] != 0 || got["Secret"] != 1 || got["ServiceAccount"] != 1 {
			t.Errorf("hub access renders %v, want a ServiceAccount, its token Secret and RBAC only", got)
		}
	},
}, {
	name:      "hub access, all namespaces",
	namespace: "karpenter",
	toHub:     true,
	set:       []string{"hubAccessOnly=true"},
	check: func(t *testing.T, objs []*unstructured.Unstructured) {
		checkRules(t, objs, "ClusterRole", "-hub", generatedRules(t, "config/rbac/hub/role.yaml"))
	},
}}

// TestHelmChart renders the chart with the pinned helm for each case and
// applies the result (CRDs included) with server-side dry-run to the cluster
// it is for.
func TestHelmChart(t *testing.T) {
	for _, c := range helmCases {
		t.Run(c.name, func(t *testing.T) {
			args := []string{"template", "karpenter-clusterapi", chartDir, "--namespace", c.namespace, "--include-crds"}
			for _, s := range c.set {
				args = append(args, "--set", s)
			}
			out, err := runTool(t, helmTool, args...)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := decode(out)
			if err != nil {
				t.Fatal(err)
			}
			target := spoke
			if c.toHub {
				target = hub
				// CRDs go to the workload cluster (helm install --skip-crds on the hub).
				var rest []*unstructured.Unstructured
				for _, o := range objs {
					if o.GetKind() != "CustomResourceDefinition" {
						rest = append(rest, o)
					}
				}
				objs = rest
			}
			ensureNamespace(t, target, c.namespace)
			for _, obj := range objs {
				if err := applyDryRun(target, obj, c.namespace); err != nil {
					t.Error(err)
				}
			}
			c.check(t, objs)
		})
	}
}

// TestHelmChartRefusesBadValues: settings the binary would reject at start
// fail at render time instead.
func TestHelmChartRefusesBadValues(t *testing.T) {
	for _, c := range []struct {
		name, namespace, want string
		set                   []string
	}{
		{"unknown topology", "karpenter", "topology must be", []string{"topology=hub"}},
		{"management cluster without a cluster name", "my-cluster", "set clusterAPI.clusterName", []string{"topology=management-cluster"}},
		{"management cluster in another namespace", "karpenter", "install the release into the Cluster's namespace", []string{"topology=management-cluster", "clusterAPI.clusterName=c", "clusterAPI.namespace=my-cluster"}},
		{"cluster name without namespace", "karpenter", "requires clusterAPI.namespace", []string{"clusterAPI.clusterName=c"}},
		{"bad installWorkloadCRDs", "karpenter", "installWorkloadCRDs must be", []string{"installWorkloadCRDs=yes"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := []string{"template", "karpenter-clusterapi", chartDir, "--namespace", c.namespace}
			for _, s := range c.set {
				args = append(args, "--set", s)
			}
			_, err := runTool(t, helmTool, args...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("helm template %v: error %v, want one containing %q", c.set, err, c.want)
			}
		})
	}
}

// TestChartInSync: the chart's CRDs and RBAC rules are the copies `make
// generate` makes of config/ (which `make verify` keeps fresh), and
// config/crd/karpenter is the Karpenter module's.
func TestChartInSync(t *testing.T) {
	root := environment.RepoRoot()
	karpenter, err := environment.ModuleDir("sigs.k8s.io/karpenter")
	if err != nil {
		t.Fatal(err)
	}
	pairs := map[string]string{ // copy -> original
		"charts/karpenter-clusterapi/rbac/hub-role.yaml":          filepath.Join(root, "config/rbac/hub/role.yaml"),
		"charts/karpenter-clusterapi/rbac/workload-role.yaml":     filepath.Join(root, "config/rbac/workload/role.yaml"),
		"charts/karpenter-clusterapi/rbac/core-role.yaml":         filepath.Join(root, "config/rbac/workload/core_role.yaml"),
		"charts/karpenter-clusterapi/rbac/csr-approver-role.yaml": filepath.Join(root, "config/rbac/csr-approver/role.yaml"),
		autonodeChartDir + "/rbac/autonode-role.yaml":             filepath.Join(root, "config/rbac/autonode/role.yaml"),
		autonodeChartDir + "/rbac/hub-role.yaml":                  filepath.Join(root, "config/rbac/hub/role.yaml"),
	}
	var want []string
	for _, dir := range []string{"config/crd/bases", "config/crd/karpenter"} {
		files, _ := filepath.Glob(filepath.Join(root, dir, "*.yaml"))
		for _, f := range files {
			pairs["charts/karpenter-clusterapi/crds/"+filepath.Base(f)] = f
			want = append(want, filepath.Base(f))
		}
	}
	for _, f := range []string{"karpenter.sh_nodepools.yaml", "karpenter.sh_nodeclaims.yaml", "karpenter.sh_nodeoverlays.yaml"} {
		pairs["config/crd/karpenter/"+f] = filepath.Join(karpenter, "pkg", "apis", "crds", f)
	}
	for cp, orig := range pairs {
		a, errA := os.ReadFile(filepath.Join(root, cp))
		b, errB := os.ReadFile(orig)
		if errA != nil || errB != nil {
			t.Errorf("%s: %v %v", cp, errA, errB)
			continue
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s: run 'make generate'", cp, orig)
		}
	}
	got, _ := filepath.Glob(filepath.Join(root, chartDir, "crds", "*"))
	for i := range got {
		got[i] = filepath.Base(got[i])
	}
	sort.Strings(got)
	sort.Strings(want)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("chart crds/ holds %v, want %v: run 'make generate'", got, want)
	}
}

// checkEnv checks environment variables of the rendered Deployment.
func checkEnv(t *testing.T, objs []*unstructured.Unstructured, want map[string]string) {
	t.Helper()
	d := find(objs, "Deployment")[0]
	env := map[string]string{}
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	for _, e := range containers[0].(map[string]any)["env"].([]any) {
		m := e.(map[string]any)
		if v, ok := m["value"].(string); ok {
			env[m["name"].(string)] = v
		}
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("env %s = %q, want %q", k, env[k], v)
		}
	}
}

// checkNoCSRApprover: without approveKubeletCSRs (or its kustomize
// component) nothing of the kubelet certificate approver is rendered.
func checkNoCSRApprover(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		if strings.HasSuffix(o.GetName(), "-csr-approver") {
			t.Errorf("%s %s rendered with the approver off", o.GetKind(), o.GetName())
		}
	}
	d := find(objs, "Deployment")[0]
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	env, _ := containers[0].(map[string]any)["env"].([]any)
	for _, e := range env {
		if e.(map[string]any)["name"] == "APPROVE_KUBELET_CSRS" {
			t.Error("APPROVE_KUBELET_CSRS set with the approver off")
		}
	}
}

// checkBound: the ClusterRoleBinding named *suffix binds the provider's
// ServiceAccount in namespace.
func checkBound(t *testing.T, objs []*unstructured.Unstructured, suffix, namespace string) {
	t.Helper()
	for _, o := range find(objs, "ClusterRoleBinding") {
		if !strings.HasSuffix(o.GetName(), suffix) {
			continue
		}
		subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
		for _, s := range subjects {
			m := s.(map[string]any)
			if m["kind"] == "ServiceAccount" && m["namespace"] == namespace {
				return
			}
		}
		t.Errorf("ClusterRoleBinding %s binds no ServiceAccount in %s: %v", o.GetName(), namespace, subjects)
		return
	}
	t.Errorf("no ClusterRoleBinding named *%s", suffix)
}
