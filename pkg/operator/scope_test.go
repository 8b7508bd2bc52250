package operator

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
)

// Defect 6 of issue 16: an unscoped provider in a namespace of several
// Clusters took the other Clusters' Machines for its own. It now serves the
// only Cluster in scope, or refuses to start with one line naming the flag.
func TestUnscopedProviderServesTheOnlyClusterOrRefuses(t *testing.T) {
	cluster := func(ns, name string) clusterv1.Cluster {
		return clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	got, err := pickCluster(hub.Scope{}, []clusterv1.Cluster{cluster("team-a", "c1")}, func(string) {})
	if err != nil || got != (hub.Scope{Namespace: "team-a", ClusterName: "c1"}) {
		t.Fatalf("one Cluster: scope %+v, %v; want team-a/c1", got, err)
	}
	for _, clusters := range [][]clusterv1.Cluster{nil, {cluster("team-a", "c1"), cluster("team-a", "c2")}} {
		_, err := pickCluster(hub.Scope{Namespace: "team-a"}, clusters, func(string) {})
		if err == nil || !strings.Contains(err.Error(), "--cluster-api-cluster-name") || strings.Contains(err.Error(), "\n") {
			t.Fatalf("%d Clusters: %v; want one line naming --cluster-api-cluster-name", len(clusters), err)
		}
	}
}
