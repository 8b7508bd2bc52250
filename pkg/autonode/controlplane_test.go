package autonode

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A ClusterClass sets the knob on the control plane of each of its
// Clusters; the Cluster's own label and annotations win.
func TestControlPlaneKnob(t *testing.T) {
	cp := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
		Labels:      map[string]string{EnabledLabel: Enabled},
		Annotations: map[string]string{ReplicasAnnotation: "2", LogLevelAnnotation: "debug", "unrelated": "x"},
	}}
	s, errs := Parse(withControlPlaneKnob(cluster(nil, map[string]string{LogLevelAnnotation: "error"}), cp))
	if len(errs) > 0 || !s.Enabled || s.Replicas != 2 || s.LogLevel != "error" {
		t.Errorf("from the control plane: %+v %v", s, errs)
	}
	s, _ = Parse(withControlPlaneKnob(cluster(map[string]string{"team": "a"}, nil), &metav1.PartialObjectMetadata{}))
	if s.Enabled {
		t.Error("enabled without a knob anywhere")
	}
	off := cluster(map[string]string{EnabledLabel: Disabled}, nil)
	if s, _ := Parse(withControlPlaneKnob(off, cp)); s.Enabled {
		t.Error("the Cluster's own disabled label must win over its control plane's")
	}
}
