package machine

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// During an upgrade the control plane's spec.version (and a topology's
// version) move first; workers follow the version it runs, never ahead of it.
func TestControlPlaneVersionIsWhatItRuns(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		spec, status, topology string
		want                   string
	}{
		{name: "upgrading: the running version", spec: "v1.36.4", status: "v1.36.3", topology: "v1.36.4", want: "v1.36.3"},
		{name: "upgraded", spec: "v1.36.4", status: "v1.36.4", topology: "v1.36.4", want: "v1.36.4"},
		{name: "not reported yet: the asked version", spec: "v1.36.3", want: "v1.36.3"},
		{name: "no version on the object: the topology's", topology: "v1.36.3", want: "v1.36.3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := &unstructured.Unstructured{Object: map[string]any{}}
			if tc.spec != "" {
				_ = unstructured.SetNestedField(cp.Object, tc.spec, "spec", "version")
			}
			if tc.status != "" {
				_ = unstructured.SetNestedField(cp.Object, tc.status, "status", "version")
			}
			if got := controlPlaneVersion(cp, tc.topology); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
