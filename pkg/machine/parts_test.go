package machine

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util"
)

// A part is made owned and labelled exactly as Cluster API's Machine
// controller makes it (ensureExternalOwnershipAndWatch compares with
// util.HasExactOwnerRef and the cluster-name label): the controller then
// has nothing to patch, and CAPA's util.GetOwnerMachine finds the Machine.
func TestPartsAreOwnedAsTheMachineControllerOwnsThem(t *testing.T) {
	m := &clusterv1.Machine{}
	m.Name, m.Namespace, m.UID = "c1-claim", "ns", "uid-1"
	m.Spec.ClusterName = "c1"
	part := &unstructured.Unstructured{}
	part.SetLabels(map[string]string{"from-template": "x"})
	ownedBy(part, m)

	desired := metav1.OwnerReference{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: m.Name, UID: m.UID, Controller: ptr.To(true)}
	if !util.HasExactOwnerRef(part.GetOwnerReferences(), desired) {
		t.Fatalf("owner references %+v are not the Machine controller's %+v", part.GetOwnerReferences(), desired)
	}
	if got := part.GetLabels()[clusterv1.ClusterNameLabel]; got != "c1" {
		t.Fatalf("cluster-name label %q, want c1", got)
	}
	if part.GetLabels()["from-template"] != "x" {
		t.Fatal("the template's labels were dropped")
	}
	if ref := machineOwner(part); ref == nil || ref.UID != m.UID {
		t.Fatalf("machineOwner = %+v", ref)
	}
}
