package hub

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func TestListOptionsKeepEveryLabelCondition(t *testing.T) {
	scope := Scope{Namespace: "ns", ClusterName: "c1"}
	sel := HasLabel(labels.SelectorFromSet(labels.Set{"pool": "general"}), "member")
	lo := &client.ListOptions{}
	lo.ApplyOptions(scope.ListOptions(sel))
	if lo.Namespace != "ns" {
		t.Fatalf("namespace = %q", lo.Namespace)
	}
	for _, tc := range []struct {
		labels map[string]string
		want   bool
	}{
		{map[string]string{"pool": "general", "member": "", clusterv1.ClusterNameLabel: "c1"}, true},
		{map[string]string{"pool": "general", clusterv1.ClusterNameLabel: "c1"}, false},
		{map[string]string{"pool": "general", "member": "", clusterv1.ClusterNameLabel: "c2"}, false},
		{map[string]string{"member": "", clusterv1.ClusterNameLabel: "c1"}, false},
	} {
		if got := lo.LabelSelector.Matches(labels.Set(tc.labels)); got != tc.want {
			t.Errorf("labels %v: match = %v, want %v", tc.labels, got, tc.want)
		}
	}
}

func TestContains(t *testing.T) {
	obj := func(ns, cluster string) client.Object {
		return &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Labels: map[string]string{clusterv1.ClusterNameLabel: cluster}}}
	}
	scoped := Scope{Namespace: "ns", ClusterName: "c1"}
	if !scoped.Contains(obj("ns", "c1"), "c1") {
		t.Error("object of the scoped Cluster not contained")
	}
	if scoped.Contains(obj("other", "c1"), "c1") || scoped.Contains(obj("ns", "c2"), "c2") || scoped.Contains(obj("ns", "c1"), "c2") {
		t.Error("object outside the scope contained")
	}
	if !(Scope{}).Contains(obj("any", "any"), "any") {
		t.Error("unscoped scope must contain everything")
	}
}
