package operator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/awslabs/operatorpkg/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

func awsTemplate(t *testing.T, namespace, name, instanceType string, labels, annotations map[string]string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "AWSMachineTemplate",
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"instanceType": instanceType}}},
	}}
	u.SetNamespace(namespace)
	u.SetName(name)
	u.SetLabels(labels)
	u.SetAnnotations(annotations)
	if err := hub.Client.Create(context.Background(), u); err != nil {
		t.Fatalf("creating AWSMachineTemplate %s/%s: %v", namespace, name, err)
	}
	t.Cleanup(func() { _ = hub.Client.Delete(context.Background(), u) })
	return u
}

// waitNodeClass polls the NodeClass until cond holds.
func waitNodeClass(t *testing.T, name, what string, cond func(*v1alpha1.ClusterAPINodeClass) bool) *v1alpha1.ClusterAPINodeClass {
	t.Helper()
	nc := &v1alpha1.ClusterAPINodeClass{}
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := spoke.Client.Get(ctx, client.ObjectKey{Name: name}, nc); err != nil {
			return false, nil
		}
		return cond(nc), nil
	})
	if err != nil {
		t.Fatalf("NodeClass %s: %s did not happen; status %+v", name, what, nc.Status)
	}
	return nc
}

// A Machine-mode NodeClass resolves the eligible templates of its Cluster in
// scope: a malformed one is named in the condition and skipped while the
// others serve; templates of another Cluster or namespace are not seen; a
// template change moves status.driftHash; losing the last template makes
// the NodeClass not Ready.
func TestMachineModeNodeClassStatus(t *testing.T) {
	ctx := context.Background()
	for _, ns := range []string{scopedNamespace, "team-b"} {
		ensureNamespace(t, hub.Client, ns)
	}
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: scopedNamespace, Name: scopedCluster},
		Spec: clusterv1.ClusterSpec{
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "AWSCluster", Name: scopedCluster},
		},
	}
	if err := hub.Client.Create(ctx, cluster); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	cluster.Status.FailureDomains = []clusterv1.FailureDomain{{Name: "z1"}, {Name: "z2"}}
	if err := hub.Client.Status().Update(ctx, cluster); err != nil {
		t.Fatal(err)
	}

	member := func(extra map[string]string) map[string]string {
		l := map[string]string{v1alpha1.KarpenterMemberLabel: "", "pool": "mm-status"}
		for k, v := range extra {
			l[k] = v
		}
		return l
	}
	good := awsTemplate(t, scopedNamespace, "good", "m5.large", member(nil), m5LargeCapacity)
	awsTemplate(t, scopedNamespace, "bad", "c5.large", member(nil), map[string]string{"capacity.cluster-autoscaler.kubernetes.io/cpu": "two", "capacity.cluster-autoscaler.kubernetes.io/memory": "4Gi"})
	awsTemplate(t, scopedNamespace, "other-cluster", "r5.large", member(map[string]string{clusterv1.ClusterNameLabel: "c2"}), m5LargeCapacity)
	awsTemplate(t, "team-b", "other-namespace", "m6g.large", member(nil), m5LargeCapacity)

	secret := "c1-bootstrap"
	nc := &v1alpha1.ClusterAPINodeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "mm-status"},
		Spec: v1alpha1.ClusterAPINodeClassSpec{MachineTemplate: &v1alpha1.MachineTemplate{
			InfrastructureTemplates: v1alpha1.InfrastructureTemplates{
				APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "AWSMachineTemplate",
				Selector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": "mm-status"}},
			},
			Bootstrap: v1alpha1.Bootstrap{DataSecretName: &secret},
		}},
	}
	if err := spoke.Client.Create(ctx, nc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = spoke.Client.Delete(context.Background(), nc) })

	got := waitReady(t, "mm-status", metav1.ConditionTrue)
	if strings.Join(got.Status.InstanceTypes, ",") != "m5.large" {
		t.Fatalf("instance types %v, want only m5.large (bad is skipped; other Cluster and namespace are out of scope)", got.Status.InstanceTypes)
	}
	msg := got.StatusConditions().Get(v1alpha1.ConditionTypeInstanceTypesResolved).Message
	if !strings.Contains(msg, "AWSMachineTemplate "+scopedNamespace+"/bad") || !strings.Contains(msg, "capacity.cluster-autoscaler.kubernetes.io/cpu") {
		t.Fatalf("the condition must name the bad template and key, got %q", msg)
	}
	if strings.Contains(msg, "other-cluster") || strings.Contains(msg, "other-namespace") {
		t.Fatalf("templates out of scope must not be reported, got %q", msg)
	}
	if got.Status.DriftHash == "" {
		t.Fatal("status.driftHash is empty")
	}

	// A change to what a launch copies moves the drift hash.
	before := got.Status.DriftHash
	cur := good.DeepCopy()
	if err := hub.Client.Get(ctx, client.ObjectKeyFromObject(good), cur); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(cur.Object, "ami-0new", "spec", "template", "spec", "ami", "id"); err != nil {
		t.Fatal(err)
	}
	if err := hub.Client.Update(ctx, cur); err != nil {
		t.Fatal(err)
	}
	waitNodeClass(t, "mm-status", "a new driftHash", func(nc *v1alpha1.ClusterAPINodeClass) bool {
		return nc.Status.DriftHash != "" && nc.Status.DriftHash != before
	})

	// The last usable template stops being eligible: not Ready, and why.
	patch := client.MergeFrom(cur.DeepCopy())
	labels := cur.GetLabels()
	delete(labels, v1alpha1.KarpenterMemberLabel)
	cur.SetLabels(labels)
	if err := hub.Client.Patch(ctx, cur, patch); err != nil {
		t.Fatal(err)
	}
	notReady := waitReady(t, "mm-status", metav1.ConditionFalse)
	if c := notReady.StatusConditions().Get(status.ConditionReady); c == nil || notReady.Status.InstanceTypeCount != 0 {
		t.Fatalf("want no instance types and Ready False, got %+v", notReady.Status)
	}
}
