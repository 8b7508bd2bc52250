package manifests

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/yaml"

	"github.com/autonode/karpenter-clusterapi/pkg/caconvert"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// caExampleNamespace is the namespace the example's objects are converted
// in (they name none: kubectl's default).
const caExampleNamespace = "default"

// TestClusterAutoscalerExample renders examples/cluster-autoscaler: the
// after files must be exactly what the converter makes of before.yaml.
// UPDATE_EXAMPLES=1 rewrites them. (TestExamples applies all three.)
func TestClusterAutoscalerExample(t *testing.T) {
	dir := filepath.Join(environment.RepoRoot(), "examples", "cluster-autoscaler")
	data, err := os.ReadFile(filepath.Join(dir, "before.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(data)
	if err != nil {
		t.Fatalf("before.yaml: %v", err)
	}
	in := caconvert.Input{Templates: map[caconvert.TemplateKey]*unstructured.Unstructured{}}
	byName := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		if o.GetNamespace() == "" {
			o.SetNamespace(caExampleNamespace)
		}
		byName[o.GetKind()+"/"+o.GetName()] = o
		switch o.GetKind() {
		case "MachineDeployment":
			md := clusterv1.MachineDeployment{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &md); err != nil {
				t.Fatalf("before.yaml: %s: %v", describe(o), err)
			}
			in.MachineDeployments = append(in.MachineDeployments, md)
		case "MachineSet":
			ms := clusterv1.MachineSet{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ms); err != nil {
				t.Fatalf("before.yaml: %s: %v", describe(o), err)
			}
			in.MachineSets = append(in.MachineSets, ms)
		default:
			gv := o.GroupVersionKind()
			in.Templates[caconvert.TemplateKey{Namespace: o.GetNamespace(), APIGroup: gv.Group, Kind: gv.Kind, Name: o.GetName()}] = o
		}
	}
	res := caconvert.Convert(in, caconvert.Settings{Expanders: []string{"random"}})

	var workload bytes.Buffer
	workload.WriteString("# The converter's output for before.yaml, for the WORKLOAD cluster (generated:\n" +
		"# see README.md). Applied with kubectl apply --server-side, or by the converter's --apply.\n")
	if err := caconvert.Render(&workload, caconvert.Result{Workload: res.Workload, Findings: res.Findings}); err != nil {
		t.Fatal(err)
	}
	var management bytes.Buffer
	management.WriteString("# before.yaml's MachineDeployments with the labels the converter adds, in the\n" +
		"# MANAGEMENT cluster (generated: see README.md).\n")
	for _, patch := range res.Hub {
		o := byName[patch.GetKind()+"/"+patch.GetName()].DeepCopy()
		if o == nil {
			t.Fatalf("the converter patches %s, which before.yaml does not hold", describe(patch))
		}
		labels := o.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		for k, v := range patch.GetLabels() {
			labels[k] = v
		}
		o.SetLabels(labels)
		ann := o.GetAnnotations()
		for k, v := range patch.GetAnnotations() {
			ann[k] = v
		}
		o.SetAnnotations(ann)
		unstructured.RemoveNestedField(o.Object, "metadata", "namespace")
		out, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		management.WriteString("---\n")
		management.Write(out)
	}

	for name, want := range map[string][]byte{"after-workload.yaml": workload.Bytes(), "after-management.yaml": management.Bytes()} {
		path := filepath.Join(dir, name)
		if os.Getenv("UPDATE_EXAMPLES") != "" {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("examples/cluster-autoscaler/%s is not the converter's output for before.yaml (UPDATE_EXAMPLES=1 rewrites it); want:\n%s", name, want)
		}
	}
}
