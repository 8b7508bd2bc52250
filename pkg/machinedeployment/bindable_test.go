package machinedeployment

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// Which Machines a reservation may take. A Machine made for a raise whose
// instance booted before it was bound (the leader was down) has a Node that
// awaits registration: bindable. A Machine whose Node runs, or may run,
// somebody's workloads never is (defect 2), nor one whose Node the spoke
// cannot show.
func TestBindableMachines(t *testing.T) {
	const pid = "aws:///us-east-1a/i-0123"
	node := func(name string, mutate func(*corev1.Node)) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}},
			Spec: corev1.NodeSpec{ProviderID: pid, Taints: []corev1.Taint{karpv1.UnregisteredNoExecuteTaint}}}
		if mutate != nil {
			mutate(n)
		}
		return n
	}
	nodes := []*corev1.Node{
		node("awaiting", nil),
		node("registered", func(n *corev1.Node) {
			n.Spec.Taints = nil
			n.Labels[karpv1.NodeRegisteredLabelKey] = "true"
			n.Labels[karpv1.NodePoolLabelKey] = "default"
		}),
		node("untainted", func(n *corev1.Node) { n.Spec.Taints = nil }),
		node("other-instance", func(n *corev1.Node) { n.Spec.ProviderID = "aws:///us-east-1a/i-0999" }),
		node("pool-labelled", func(n *corev1.Node) { n.Labels[karpv1.NodePoolLabelKey] = "default" }),
	}
	b := fake.NewClientBuilder()
	for _, n := range nodes {
		b = b.WithObjects(n)
	}
	c := &Controller{spoke: b.Build()}
	machine := func(nodeName string, mutate func(*clusterv1.Machine)) *clusterv1.Machine {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", Annotations: map[string]string{}}}
		if nodeName != "" {
			m.Spec.ProviderID = pid
			m.Status.NodeRef = clusterv1.MachineNodeReference{Name: nodeName}
		}
		if mutate != nil {
			mutate(m)
		}
		return m
	}
	now := metav1.NewTime(time.Now())
	for _, tc := range []struct {
		name string
		m    *clusterv1.Machine
		want bool
	}{
		{"no Node yet", machine("", nil), true},
		{"providerID, no Node yet", machine("", func(m *clusterv1.Machine) { m.Spec.ProviderID = pid }), true},
		{"Node awaiting registration", machine("awaiting", nil), true},
		{"Node registered by Karpenter", machine("registered", nil), false},
		{"Node without the unregistered taint", machine("untainted", nil), false},
		{"Node of another instance", machine("other-instance", nil), false},
		{"Node with a NodePool label", machine("pool-labelled", nil), false},
		{"Node the spoke does not show", machine("missing", nil), false},
		{"bound", machine("", func(m *clusterv1.Machine) { m.Annotations[v1alpha1.NodeClaimAnnotation] = "nc" }), false},
		{"marked", machine("", func(m *clusterv1.Machine) { m.Annotations[clusterv1.DeleteMachineAnnotation] = "x" }), false},
		{"being deleted", machine("", func(m *clusterv1.Machine) { m.DeletionTimestamp = &now; m.Finalizers = []string{"f"} }), false},
	} {
		if got := c.bindable(context.Background(), tc.m); got != tc.want {
			t.Errorf("%s: bindable %v, want %v", tc.name, got, tc.want)
		}
	}
}
