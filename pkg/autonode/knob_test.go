package autonode

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

func cluster(labels, annotations map[string]string) *clusterv1.Cluster {
	return &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "prod", UID: "uid-1", Labels: labels, Annotations: annotations}}
}

func TestParseDefaults(t *testing.T) {
	s, errs := Parse(cluster(map[string]string{EnabledLabel: Enabled}, nil))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if !s.Enabled || s.Replicas != 1 || s.LogLevel != "info" || s.ApproveKubeletCSRs || s.Image != "" || s.OnDisable != RemoveNodes {
		t.Errorf("defaults: %+v", s)
	}
	if got := s.Requests[corev1.ResourceMemory]; got.Cmp(resource.MustParse("1Gi")) != 0 {
		t.Errorf("memory request %s", got.String())
	}
}

func TestParseSettings(t *testing.T) {
	s, errs := Parse(cluster(map[string]string{EnabledLabel: Enabled}, map[string]string{
		ApproveKubeletCSRsAnnotation: "true", ReplicasAnnotation: "2", ResourcesAnnotation: "cpu=250m, memory=768Mi",
		LogLevelAnnotation: "debug", ImageAnnotation: "registry.example/kc:v2", OnDisableAnnotation: KeepNodes,
	}))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	cpu, mem := s.Requests[corev1.ResourceCPU], s.Requests[corev1.ResourceMemory]
	if !s.ApproveKubeletCSRs || s.Replicas != 2 || cpu.String() != "250m" || mem.String() != "768Mi" ||
		s.LogLevel != "debug" || s.Image != "registry.example/kc:v2" || s.OnDisable != KeepNodes {
		t.Errorf("settings: %+v", s)
	}
}

// Every malformed setting is reported with the field it is in.
func TestParseMalformedNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		labels, annotations map[string]string
		field               string
	}{
		{map[string]string{EnabledLabel: "yes"}, nil, EnabledLabel},
		{nil, map[string]string{ReplicasAnnotation: "two"}, ReplicasAnnotation},
		{nil, map[string]string{ReplicasAnnotation: "6"}, ReplicasAnnotation},
		{nil, map[string]string{ReplicasAnnotation: "-1"}, ReplicasAnnotation},
		{nil, map[string]string{ApproveKubeletCSRsAnnotation: "sometimes"}, ApproveKubeletCSRsAnnotation},
		{nil, map[string]string{ResourcesAnnotation: "cpu=lots"}, ResourcesAnnotation},
		{nil, map[string]string{ResourcesAnnotation: "gpu=1"}, ResourcesAnnotation},
		{nil, map[string]string{ResourcesAnnotation: "cpu=1,cpu=2"}, ResourcesAnnotation},
		{nil, map[string]string{ResourcesAnnotation: "memory=0"}, ResourcesAnnotation},
		{nil, map[string]string{ResourcesAnnotation: "cpu"}, ResourcesAnnotation},
		{nil, map[string]string{LogLevelAnnotation: "loud"}, LogLevelAnnotation},
		{nil, map[string]string{ImageAnnotation: ""}, ImageAnnotation},
		{nil, map[string]string{OnDisableAnnotation: "Maybe"}, OnDisableAnnotation},
	} {
		l := map[string]string{EnabledLabel: Enabled}
		for k, v := range tc.labels {
			l[k] = v
		}
		_, errs := Parse(cluster(l, tc.annotations))
		if len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.field) {
			t.Errorf("%v %v: want one error naming %s, got %v", tc.labels, tc.annotations, tc.field, errs)
		}
	}
}

func TestParseLongClusterName(t *testing.T) {
	c := cluster(map[string]string{EnabledLabel: Enabled}, nil)
	c.Name = strings.Repeat("x", 60)
	if _, errs := Parse(c); len(errs) != 1 || !strings.Contains(errs[0].Error(), "metadata.name") {
		t.Errorf("a name leaving no room for %q: %v", nameSuffix, errs)
	}
}
