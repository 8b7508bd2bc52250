package operator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// A MachineDeployment of a Cluster topology whose worker sets replicas is
// reported on the NodeClass (condition TopologyReplicas, naming the Cluster
// and the worker); unsetting the worker's replicas clears it.
func TestNodeClassReportsReplicasPinnedByTopology(t *testing.T) {
	ctx := context.Background()
	ensureNamespace(t, hub.Client, scopedNamespace)
	topology := clusterv1.Topology{
		ClassRef: clusterv1.ClusterClassRef{Name: "quick-start"},
		Version:  "v1.33.1",
		Workers: clusterv1.WorkersTopology{MachineDeployments: []clusterv1.MachineDeploymentTopology{
			{Class: "default-worker", Name: "md-0", Replicas: ptr.To[int32](2)},
		}},
	}
	// The provider serves Cluster c1; other tests may have made it already.
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: scopedNamespace, Name: scopedCluster}}
	if err := hub.Client.Get(ctx, client.ObjectKeyFromObject(cluster), cluster); apierrors.IsNotFound(err) {
		cluster.Spec.Topology = topology
		if err := hub.Client.Create(ctx, cluster); err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	} else {
		before := cluster.Spec.Topology
		cluster.Spec.Topology = topology
		if err := hub.Client.Update(ctx, cluster); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			c := &clusterv1.Cluster{}
			if hub.Client.Get(ctx, client.ObjectKeyFromObject(cluster), c) == nil {
				c.Spec.Topology = before
				_ = hub.Client.Update(ctx, c)
			}
		})
	}
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: scopedNamespace, Name: "c1-md-0-abcde", ClusterName: scopedCluster, Member: true,
		Labels: map[string]string{
			clusterv1.ClusterTopologyOwnedLabel:                 "",
			clusterv1.ClusterTopologyMachineDeploymentNameLabel: "md-0",
			"pool": "topology",
		},
		Annotations: m5LargeCapacity,
	})
	if err := hub.Client.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hub.Client.Delete(ctx, md) })
	nc := &v1alpha1.ClusterAPINodeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "topology"},
		Spec: v1alpha1.ClusterAPINodeClassSpec{
			ScalableResourceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "topology"}},
		},
	}
	if err := spoke.Client.Create(ctx, nc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = spoke.Client.Delete(ctx, nc) })

	msg := waitTopologyCondition(t, nc.Name, metav1.ConditionFalse)
	for _, want := range []string{"MachineDeployment team-a/c1-md-0-abcde", "Cluster team-a/c1", "machineDeployments[name=md-0].replicas to 2"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message does not say %q: %q", want, msg)
		}
	}

	// The user removes replicas from the worker: the topology leaves the
	// MachineDeployment's replicas to Karpenter.
	if err := hub.Client.Get(ctx, client.ObjectKeyFromObject(cluster), cluster); err != nil {
		t.Fatal(err)
	}
	cluster.Spec.Topology.Workers.MachineDeployments[0].Replicas = nil
	if err := hub.Client.Update(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	waitTopologyCondition(t, nc.Name, metav1.ConditionTrue)
}

func waitTopologyCondition(t *testing.T, name string, want metav1.ConditionStatus) string {
	t.Helper()
	var msg string
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		nc := &v1alpha1.ClusterAPINodeClass{}
		if err := spoke.Client.Get(ctx, client.ObjectKey{Name: name}, nc); err != nil {
			return false, nil
		}
		c := nc.StatusConditions().Get(v1alpha1.ConditionTypeTopologyReplicas)
		if c == nil {
			return false, nil
		}
		msg = c.Message
		return c.Status == want, nil
	})
	if err != nil {
		t.Fatalf("NodeClass %s: TopologyReplicas did not become %s (message %q)", name, want, msg)
	}
	return msg
}
