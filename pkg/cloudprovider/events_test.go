package cloudprovider

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// The Launched event names the Machine and what it was made from, in both modes.
func TestLaunchedMessageNamesMachineAndOrigin(t *testing.T) {
	created := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{
		corev1.LabelInstanceTypeStable: "m5.large", corev1.LabelTopologyZone: "us-east-1a", karpv1.CapacityTypeLabelKey: "reserved",
		v1alpha1.LabelCapacityReservationID: "cr-1",
	}}}
	md := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "md-a-xyz", Labels: map[string]string{clusterv1.MachineDeploymentNameLabel: "md-a"}}}
	// The instance's providerID, which the Machine gets only once it booted.
	created.Status.ProviderID = "aws:///us-east-1a/i-1"
	if got, want := launchedMessage(md, created, "MachineDeployment ns/md-a"), "Machine ns/md-a-xyz from MachineDeployment ns/md-a: m5.large in us-east-1a (reserved, reservation cr-1), providerID aws:///us-east-1a/i-1"; got != want {
		t.Errorf("MachineDeployment mode:\n got %q\nwant %q", got, want)
	}
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c1-claim", Annotations: map[string]string{v1alpha1.OfferingAnnotation: "ns/tmpl/us-east-1a/reserved"}}}
	m.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{Kind: "AWSMachine"}
	created.Status.ProviderID = "aws:///us-east-1a/i-2"
	if got, want := launchedMessage(m, created, "AWSMachineTemplate ns/tmpl"), "Machine ns/c1-claim from AWSMachineTemplate ns/tmpl: m5.large in us-east-1a (reserved, reservation cr-1), providerID aws:///us-east-1a/i-2"; got != want {
		t.Errorf("Machine mode:\n got %q\nwant %q", got, want)
	}
}
