package operator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/awslabs/operatorpkg/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

func ensureNamespace(t *testing.T, c client.Client, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Create(context.Background(), ns); client.IgnoreAlreadyExists(err) != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
}

// waitReady waits until the NodeClass's Ready condition has the wanted
// status and returns the NodeClass.
func waitReady(t *testing.T, name string, want metav1.ConditionStatus) *v1alpha1.ClusterAPINodeClass {
	t.Helper()
	nc := &v1alpha1.ClusterAPINodeClass{}
	var last *status.Condition
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := spoke.Client.Get(ctx, client.ObjectKey{Name: name}, nc); err != nil {
			return false, nil
		}
		last = nc.StatusConditions().Get(status.ConditionReady)
		return last != nil && last.Status == want && last.ObservedGeneration == nc.Generation, nil
	})
	if err != nil {
		t.Fatalf("NodeClass %s: Ready did not become %s; last condition: %+v", name, want, last)
	}
	return nc
}

var m5LargeCapacity = map[string]string{
	"capacity.cluster-autoscaler.kubernetes.io/cpu":    "2",
	"capacity.cluster-autoscaler.kubernetes.io/memory": "8Gi",
}

func TestNodeClassReadyFollowsMachineDeploymentsInScope(t *testing.T) {
	ctx := context.Background()
	for _, ns := range []string{scopedNamespace, "team-b"} {
		ensureNamespace(t, hub.Client, ns)
	}
	nc := &v1alpha1.ClusterAPINodeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "general"},
		Spec: v1alpha1.ClusterAPINodeClassSpec{
			ScalableResourceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "general"}},
		},
	}
	if err := spoke.Client.Create(ctx, nc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = spoke.Client.Delete(ctx, nc) })

	got := waitReady(t, nc.Name, metav1.ConditionFalse)
	cond := got.StatusConditions().Get(v1alpha1.ConditionTypeInstanceTypesResolved)
	if cond.Reason != "NothingSelected" || !strings.Contains(cond.Message, `namespace "team-a"`) || !strings.Contains(cond.Message, `Cluster "c1"`) {
		t.Fatalf("want reason NothingSelected naming the scope, got %s: %s", cond.Reason, cond.Message)
	}

	// Matching MachineDeployments outside the scope do not count.
	outside := []*environment.MachineDeploymentOptions{
		{Namespace: "team-b", Name: "other-namespace", ClusterName: scopedCluster},
		{Namespace: scopedNamespace, Name: "other-cluster", ClusterName: "c2"},
	}
	for _, o := range outside {
		o.Member = true
		o.Annotations = m5LargeCapacity
		o.Labels = map[string]string{"pool": "general"}
		o.TemplateLabels = map[string]string{corev1.LabelInstanceTypeStable: "m5.large"}
		if err := hub.Client.Create(ctx, environment.NewMachineDeployment(*o)); err != nil {
			t.Fatal(err)
		}
	}
	// In scope but without the member label: not eligible either.
	if err := hub.Client.Create(ctx, environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: scopedNamespace, Name: "not-a-member", ClusterName: scopedCluster, Labels: map[string]string{"pool": "general"},
		Annotations: m5LargeCapacity, TemplateLabels: map[string]string{corev1.LabelInstanceTypeStable: "m5.large"},
	})); err != nil {
		t.Fatal(err)
	}
	// Give the controller every chance to (wrongly) count them.
	consistently(t, 3*time.Second, func() bool {
		return readyStatus(t, nc.Name) == metav1.ConditionFalse
	}, "NodeClass left Ready=False although only MachineDeployments outside its scope or without the member label exist")

	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: scopedNamespace, Name: "general-m5", ClusterName: scopedCluster, Member: true,
		Labels:         map[string]string{"pool": "general"},
		TemplateLabels: map[string]string{corev1.LabelInstanceTypeStable: "m5.large"},
		Annotations:    m5LargeCapacity,
	})
	if err := hub.Client.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	got = waitReady(t, nc.Name, metav1.ConditionTrue)
	if got.Status.InstanceTypeCount != 1 || len(got.Status.InstanceTypes) != 1 || got.Status.InstanceTypes[0] != "m5.large" {
		t.Fatalf("want one instance type m5.large, got %d %v", got.Status.InstanceTypeCount, got.Status.InstanceTypes)
	}

	if err := hub.Client.Delete(ctx, md); err != nil {
		t.Fatal(err)
	}
	got = waitReady(t, nc.Name, metav1.ConditionFalse)
	if r := got.StatusConditions().Get(status.ConditionReady).Reason; r != "NothingSelected" && r != "InstanceTypesResolvedNotTrue" {
		t.Logf("Ready reason after removal: %s", r)
	}
	if got.Status.InstanceTypeCount != 0 {
		t.Fatalf("want no instance types after removal, got %v", got.Status.InstanceTypes)
	}
}

func readyStatus(t *testing.T, name string) metav1.ConditionStatus {
	nc := &v1alpha1.ClusterAPINodeClass{}
	if err := spoke.Client.Get(context.Background(), client.ObjectKey{Name: name}, nc); err != nil {
		t.Fatal(err)
	}
	if c := nc.StatusConditions().Get(status.ConditionReady); c != nil {
		return c.Status
	}
	return metav1.ConditionUnknown
}

// consistently fails the test if cond turns false within d.
func consistently(t *testing.T, d time.Duration, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !cond() {
			nc := &v1alpha1.ClusterAPINodeClass{}
			_ = spoke.Client.Get(context.Background(), client.ObjectKey{Name: "general"}, nc)
			t.Fatalf("%s: %+v", msg, nc.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
