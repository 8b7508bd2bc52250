package manifests

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/capacity"
	"github.com/autonode/karpenter-clusterapi/pkg/pricing"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// exampleVariables are the values of the clusterctl variables that have no
// default in the examples.
var exampleVariables = map[string]string{
	"CLUSTER_NAME":       "example",
	"AWS_REGION":         "us-east-1",
	"AWS_SSH_KEY_NAME":   "default",
	"KUBERNETES_VERSION": "v1.33.1",
}

// exampleNamespace is where the examples' hub objects go (clusterctl's
// --target-namespace).
const exampleNamespace = "examples"

// workloadGroups are the API groups whose objects live in the workload
// cluster; the other groups of Cluster API and its providers live in the
// management cluster.
var workloadGroups = map[string]bool{"karpenter.sh": true, v1alpha1.Group: true}

// clusterOf says which cluster an object belongs in: "spoke", "hub", or ""
// for plain Kubernetes objects that go wherever the rest of their file goes.
func clusterOf(obj *unstructured.Unstructured) string {
	group := obj.GroupVersionKind().Group
	switch {
	case workloadGroups[group]:
		return "spoke"
	case group == "cluster.x-k8s.io" || strings.HasSuffix(group, ".cluster.x-k8s.io"):
		return "hub"
	}
	return ""
}

// TestExamples applies every manifest under examples/ to the cluster it
// belongs in. It walks the tree, so a new file is covered the moment it is
// added: YAML files are applied, README.md files are read, anything else
// fails the test until this test knows what to do with it.
func TestExamples(t *testing.T) {
	root := filepath.Join(environment.RepoRoot(), "examples")
	ensureNamespace(t, hub, exampleNamespace)

	byExample := map[string][]*unstructured.Unstructured{} // top-level directory -> objects
	dirsWithManifests := map[string]bool{}
	readmes := map[string]string{}
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		files++
		rel, _ := filepath.Rel(root, path)
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		switch ext := strings.ToLower(filepath.Ext(path)); {
		case d.Name() == "README.md":
			if len(strings.TrimSpace(string(data))) == 0 {
				t.Errorf("examples/%s is empty", rel)
			}
			readmes[filepath.Dir(path)] = string(data)
		case ext == ".yaml" || ext == ".yml":
			dirsWithManifests[filepath.Dir(path)] = true
			t.Run(filepath.ToSlash(rel), func(t *testing.T) {
				example := strings.SplitN(filepath.ToSlash(rel), "/", 2)[0]
				byExample[example] = append(byExample[example], applyExample(t, rel, string(data))...)
			})
		default:
			t.Errorf("examples/%s: no test covers this kind of file (YAML manifests and README.md files are)", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 {
		t.Fatal("no files under examples/")
	}
	for dir := range dirsWithManifests {
		if !documented(dir, root, readmes) {
			rel, _ := filepath.Rel(root, dir)
			t.Errorf("examples/%s: manifests without a README.md that says what they are and how to apply them", rel)
		}
	}
	// Variables without a default must be documented in the README next to
	// the manifest or above it.
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, _ error) error {
		if d == nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return nil
		}
		data, _ := os.ReadFile(path)
		for _, v := range requiredVariables(string(data)) {
			if !mentioned(filepath.Dir(path), root, readmes, v) {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("examples/%s uses ${%s} without a default, and no README.md mentions it", rel, v)
			}
		}
		return nil
	})
	for example, objs := range byExample {
		t.Run("consistency/"+example, func(t *testing.T) { checkExampleConsistency(t, objs) })
	}
}

// applyExample substitutes the clusterctl variables of one file and applies
// each object to the hub or the spoke.
func applyExample(t *testing.T, rel, text string) []*unstructured.Unstructured {
	substituted, missing := envsubst(text, exampleVariables)
	if len(missing) > 0 {
		t.Fatalf("examples/%s uses variables without a default that the test does not set: %v (add them to exampleVariables)", rel, missing)
	}
	if strings.Contains(substituted, "${") {
		t.Fatalf("examples/%s: a ${...} is left after substitution", rel)
	}
	objs, err := decode([]byte(substituted))
	if err != nil {
		t.Fatalf("examples/%s: %v", rel, err)
	}
	if len(objs) == 0 {
		t.Fatalf("examples/%s holds no object", rel)
	}
	// A file is applied to one cluster: the one its Karpenter or Cluster API
	// objects belong in; plain Kubernetes objects alone are workloads.
	where := ""
	for _, obj := range objs {
		c := clusterOf(obj)
		if c != "" && where != "" && c != where {
			t.Fatalf("examples/%s mixes objects of the management and the workload cluster (%s): split it, one file per cluster", rel, describe(obj))
		}
		if c != "" {
			where = c
		}
	}
	target := spoke
	if where == "hub" {
		target = hub
	}
	for _, obj := range objs {
		obj = withClusterAPIDefaults(obj)
		if err := applyDryRun(target, obj, exampleNamespace); err != nil {
			t.Errorf("examples/%s: %v", rel, err)
		}
	}
	return objs
}

func documented(dir, root string, readmes map[string]string) bool {
	for ; strings.HasPrefix(dir, root); dir = filepath.Dir(dir) {
		if _, ok := readmes[dir]; ok {
			return true
		}
	}
	return false
}

func mentioned(dir, root string, readmes map[string]string, word string) bool {
	for ; strings.HasPrefix(dir, root); dir = filepath.Dir(dir) {
		if strings.Contains(readmes[dir], word) {
			return true
		}
	}
	return false
}

// checkExampleConsistency checks, within one example, what the API servers
// cannot: that the objects fit together the way the provider reads them.
func checkExampleConsistency(t *testing.T, objs []*unstructured.Unstructured) {
	names := func(kind string) map[string]bool {
		out := map[string]bool{}
		for _, o := range find(objs, kind) {
			out[o.GetName()] = true
		}
		return out
	}
	members := func(kind string) []*unstructured.Unstructured {
		var out []*unstructured.Unstructured
		for _, o := range find(objs, kind) {
			if _, ok := o.GetLabels()[v1alpha1.KarpenterMemberLabel]; ok {
				out = append(out, o)
			}
		}
		return out
	}
	memberMDs, memberTemplates := members("MachineDeployment"), members("AWSMachineTemplate")
	kubeadmConfigTemplates := names("KubeadmConfigTemplate")

	// What the NodeClasses select must be sized and priced before any node exists.
	var selected []*unstructured.Unstructured
	for _, nc := range find(objs, "ClusterAPINodeClass") {
		var got []*unstructured.Unstructured
		if sel, found, _ := unstructured.NestedMap(nc.Object, "spec", "scalableResourceSelector"); found {
			if got = selectedBy(t, nc, sel, memberMDs); len(got) == 0 {
				t.Errorf("%s: its scalableResourceSelector selects no member MachineDeployment of this example", describe(nc))
			}
		} else {
			sel, _, _ := unstructured.NestedMap(nc.Object, "spec", "machineTemplate", "infrastructureTemplates", "selector")
			if got = selectedBy(t, nc, sel, memberTemplates); len(got) == 0 {
				t.Errorf("%s: its infrastructureTemplates.selector selects no member AWSMachineTemplate of this example", describe(nc))
			}
			if ref, found, _ := unstructured.NestedString(nc.Object, "spec", "machineTemplate", "bootstrap", "configRef", "name"); found && !kubeadmConfigTemplates[ref] {
				t.Errorf("%s: bootstrap.configRef names KubeadmConfigTemplate %q, which this example does not define", describe(nc), ref)
			}
		}
		selected = append(selected, got...)
	}
	for _, o := range selected {
		checkSizedAndPriced(t, o)
	}

	for _, md := range memberMDs {
		if r, _, _ := unstructured.NestedFieldNoCopy(md.Object, "spec", "replicas"); r != nil && fmt.Sprint(r) != "0" {
			t.Errorf("%s: a member MachineDeployment starts at replicas 0 (Karpenter owns the replicas it adds), not %v", describe(md), r)
		}
		if ref, found, _ := unstructured.NestedString(md.Object, "spec", "template", "spec", "bootstrap", "configRef", "name"); found && !kubeadmConfigTemplates[ref] {
			t.Errorf("%s: bootstrap.configRef %q is not defined in this example", describe(md), ref)
		}
		infra, _, _ := unstructured.NestedString(md.Object, "spec", "template", "spec", "infrastructureRef", "name")
		if !names("AWSMachineTemplate")[infra] {
			t.Errorf("%s: infrastructureRef %q is not defined in this example", describe(md), infra)
		}
	}

	// Nodes join with the taint Karpenter removes at registration.
	for _, o := range find(objs, "KubeadmConfigTemplate") {
		taints, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "joinConfiguration", "nodeRegistration", "taints")
		if !hasTaint(taints, "karpenter.sh/unregistered", "NoExecute") {
			t.Errorf("%s: joinConfiguration.nodeRegistration.taints lacks karpenter.sh/unregistered:NoExecute", describe(o))
		}
	}

	// Every NodePool points at a NodeClass of this provider in this example.
	nodeClasses := names("ClusterAPINodeClass")
	for _, np := range find(objs, "NodePool") {
		ref, _, _ := unstructured.NestedStringMap(np.Object, "spec", "template", "spec", "nodeClassRef")
		if ref["group"] != v1alpha1.Group || ref["kind"] != "ClusterAPINodeClass" || !nodeClasses[ref["name"]] {
			t.Errorf("%s: nodeClassRef %v is not a ClusterAPINodeClass of this example", describe(np), ref)
		}
	}
}

// checkSizedAndPriced: an object a NodeClass launches from carries capacity
// the provider parses (annotations, or status.capacity) and a valid price.
func checkSizedAndPriced(t *testing.T, o *unstructured.Unstructured) {
	t.Helper()
	ann := o.GetAnnotations()
	parsed, errs := capacity.Parse(ann)
	for _, e := range errs {
		t.Errorf("%s: %v", describe(o), e)
	}
	_, hasStatus, _ := unstructured.NestedMap(o.Object, "status", "capacity")
	if !hasStatus && (parsed.Resources.Cpu().IsZero() || parsed.Resources.Memory().IsZero()) {
		t.Errorf("%s: needs the %s and %s annotations (there is no status.capacity before the infrastructure provider has seen it)", describe(o), capacity.CPUKey, capacity.MemoryKey)
	}
	priced := false
	for k, v := range ann {
		if k == v1alpha1.PriceAnnotation || k == v1alpha1.SpotPriceAnnotation || k == v1alpha1.CurrentPriceAnnotation ||
			strings.HasPrefix(k, v1alpha1.PriceAnnotation+".") || strings.HasPrefix(k, v1alpha1.SpotPriceAnnotation+".") {
			if _, err := pricing.ParsePrice(k, v); err != nil {
				t.Errorf("%s: %v", describe(o), err)
			}
			priced = true
		}
	}
	if !priced {
		t.Errorf("%s: no price annotation: its offerings would run on the estimate", describe(o))
	}
}

// withClusterAPIDefaults sets what Cluster API's defaulting webhook would on
// admission, which the test API server does not run: a MachineDeployment
// without a selector selects its own Machines by cluster and name.
func withClusterAPIDefaults(obj *unstructured.Unstructured) *unstructured.Unstructured {
	if obj.GetKind() != "MachineDeployment" || clusterOf(obj) != "hub" {
		return obj
	}
	obj = obj.DeepCopy()
	if sel, _, _ := unstructured.NestedMap(obj.Object, "spec", "selector"); len(sel) > 0 {
		return obj
	}
	cluster, _, _ := unstructured.NestedString(obj.Object, "spec", "clusterName")
	defaults := map[string]any{
		"cluster.x-k8s.io/cluster-name":    cluster,
		"cluster.x-k8s.io/deployment-name": obj.GetName(),
	}
	_ = unstructured.SetNestedMap(obj.Object, defaults, "spec", "selector", "matchLabels")
	templateLabels, _, _ := unstructured.NestedMap(obj.Object, "spec", "template", "metadata", "labels")
	if templateLabels == nil {
		templateLabels = map[string]any{}
	}
	for k, v := range defaults {
		templateLabels[k] = v
	}
	_ = unstructured.SetNestedMap(obj.Object, templateLabels, "spec", "template", "metadata", "labels")
	return obj
}

func selectedBy(t *testing.T, nc *unstructured.Unstructured, raw map[string]any, candidates []*unstructured.Unstructured) []*unstructured.Unstructured {
	sel := &metav1.LabelSelector{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, sel); err != nil {
		t.Errorf("%s: %v", describe(nc), err)
		return nil
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Errorf("%s: %v", describe(nc), err)
		return nil
	}
	var out []*unstructured.Unstructured
	for _, c := range candidates {
		if s.Matches(labels.Set(c.GetLabels())) {
			out = append(out, c)
		}
	}
	return out
}

func hasTaint(taints []any, key, effect string) bool {
	for _, raw := range taints {
		if m, ok := raw.(map[string]any); ok && m["key"] == key && m["effect"] == effect {
			return true
		}
	}
	return false
}
