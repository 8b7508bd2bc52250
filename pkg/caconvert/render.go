package caconvert

import (
	"fmt"
	"io"
	"sort"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// Render writes the report as comments, then the workload cluster's
// objects, then the management cluster's, as one YAML stream. Each object
// is preceded by a comment saying which cluster it goes to.
func Render(w io.Writer, res Result) error {
	if _, err := io.WriteString(w, Report(res.Findings)); err != nil {
		return err
	}
	write := func(where string, objs []*unstructured.Unstructured) error {
		for _, o := range objs {
			data, err := yaml.Marshal(o.Object)
			if err != nil {
				return fmt.Errorf("%s %s: %w", o.GetKind(), o.GetName(), err)
			}
			if _, err := fmt.Fprintf(w, "---\n# %s\n%s", where, data); err != nil {
				return err
			}
		}
		return nil
	}
	workload := append([]*unstructured.Unstructured(nil), res.Workload...)
	sort.SliceStable(workload, func(i, j int) bool { return ClusterOf(workload[i]) < ClusterOf(workload[j]) })
	for _, o := range workload {
		if err := write("workload cluster of Cluster "+ClusterOf(o), []*unstructured.Unstructured{o}); err != nil {
			return err
		}
	}
	return write("management cluster (labels to add; apply with kubectl apply --server-side)", res.Hub)
}
