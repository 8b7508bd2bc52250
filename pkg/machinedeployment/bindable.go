package machinedeployment

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// bindable reports whether a Machine may be bound to a NodeClaim at all:
// not bound, not marked, not being deleted, and without a Node that may run
// somebody's workloads. A providerID alone does not disqualify: the
// infrastructure sets it seconds after the Machine is created (CAPA, at
// RunInstances), so a provider that restarts during a burst would
// otherwise never bind the Machines made for its own raises (found by the
// e2e kill test). Nor does a Node that still carries Karpenter's
// unregistered taint: no NodeClaim ever registered it and, the taint being
// NoExecute, no workload runs there. Such a Node belongs to a Machine made
// for a raise whose NodeClaim was not bound before the instance booted (a
// leader failover or a restart longer than the boot: the e2e failover test
// saw ten such Machines given back and made again). Any other Node, or one
// the spoke cache cannot show, disqualifies the Machine whatever its age
// (defect 2: long-running user nodes bound to NodeClaims).
func (c *Controller) bindable(ctx context.Context, m *clusterv1.Machine) bool {
	_, bound := m.Annotations[v1alpha1.NodeClaimAnnotation]
	_, marked := m.Annotations[clusterv1.DeleteMachineAnnotation]
	if bound || marked || !m.DeletionTimestamp.IsZero() {
		return false
	}
	return noRegisteredNode(ctx, c.spoke, m)
}

// noRegisteredNode reports whether a Machine has no Node, or one that awaits
// registration; a Node the spoke cache cannot show counts as registered.
func noRegisteredNode(ctx context.Context, spoke client.Reader, m *clusterv1.Machine) bool {
	if !m.Status.NodeRef.IsDefined() {
		return true
	}
	node := &corev1.Node{}
	if err := spoke.Get(ctx, types.NamespacedName{Name: m.Status.NodeRef.Name}, node); err != nil {
		return false
	}
	return awaitsRegistration(node, m.Spec.ProviderID)
}

// awaitsRegistration reports whether a Node is one Karpenter has not
// registered: it carries the unregistered taint, no NodeClaim's labels, and
// is the Machine's instance.
func awaitsRegistration(node *corev1.Node, providerID string) bool {
	if _, registered := node.Labels[karpv1.NodeRegisteredLabelKey]; registered {
		return false
	}
	if _, pool := node.Labels[karpv1.NodePoolLabelKey]; pool {
		return false
	}
	if providerID == "" || node.Spec.ProviderID != providerID {
		return false
	}
	for _, t := range node.Spec.Taints {
		if t.MatchTaint(&karpv1.UnregisteredNoExecuteTaint) {
			return true
		}
	}
	return false
}
