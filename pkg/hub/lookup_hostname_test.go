package hub_test

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/hub/hubtest"
)

// ByHostname finds the provider's Machines by the name a kubelet asks a
// certificate for, and only those: another Cluster's Machine, or one
// Karpenter does not manage, reporting the same name is not a candidate.
func TestByHostnameOnlyInScope(t *testing.T) {
	const name = "ip-10-0-1-7.ec2.internal"
	machine := func(n, cluster string, member bool, addrs ...clusterv1.MachineAddress) *clusterv1.Machine {
		m := &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: n, Labels: map[string]string{clusterv1.ClusterNameLabel: cluster}},
			Spec:       clusterv1.MachineSpec{ClusterName: cluster},
			Status:     clusterv1.MachineStatus{Addresses: addrs},
		}
		if member {
			m.Labels[v1alpha1.KarpenterMemberLabel] = ""
		}
		return m
	}
	dns := clusterv1.MachineAddress{Type: clusterv1.MachineInternalDNS, Address: name}
	host := clusterv1.MachineAddress{Type: clusterv1.MachineHostName, Address: name}
	external := clusterv1.MachineAddress{Type: clusterv1.MachineExternalDNS, Address: name}
	h := hubtest.New(hub.Scope{Namespace: "default", ClusterName: "c1"}, interceptor.Funcs{},
		machine("ours", "c1", true, dns, host),
		machine("other-cluster", "c2", true, dns),
		machine("not-karpenter", "c1", false, dns),
		machine("external-name-only", "c1", true, external),
	)
	got, err := hub.NewLookup(h.Hub, nil).ByHostname(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Name != "ours" {
		names := []string{}
		for _, m := range got {
			names = append(names, m.Name)
		}
		t.Fatalf("ByHostname(%s) = %v, want [ours]", name, names)
	}
}

// Names compare in canonical form: a Machine reporting its name in upper
// case or with a trailing dot is found by the name in lower case, and the
// other way round.
func TestByHostnameCanonical(t *testing.T) {
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ours", Labels: map[string]string{clusterv1.ClusterNameLabel: "c1", v1alpha1.KarpenterMemberLabel: ""}},
		Spec:       clusterv1.MachineSpec{ClusterName: "c1"},
		Status:     clusterv1.MachineStatus{Addresses: clusterv1.MachineAddresses{{Type: clusterv1.MachineInternalDNS, Address: "IP-10-0-1-7.EC2.Internal."}}},
	}
	h := hubtest.New(hub.Scope{Namespace: "default", ClusterName: "c1"}, interceptor.Funcs{}, m)
	for _, name := range []string{"ip-10-0-1-7.ec2.internal", "IP-10-0-1-7.ec2.internal.", "ip-10-0-1-7.EC2.INTERNAL"} {
		got, err := hub.NewLookup(h.Hub, nil).ByHostname(context.Background(), name)
		if err != nil || len(got) != 1 {
			t.Errorf("ByHostname(%s) = %d Machines (%v), want Machine ours", name, len(got), err)
		}
	}
}
