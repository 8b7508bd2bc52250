// Package remediation keeps one remediator per Karpenter Machine.
//
// A MachineHealthCheck that selects Karpenter's Machines and Karpenter's own
// node repair (feature gate NodeRepair) would both replace the same
// unhealthy node: Cluster API deletes the Machine and its MachineSet makes
// another, while Karpenter deletes the NodeClaim and launches another, so
// one failure costs two new nodes (one of them given back later). The rule:
//
//   - NodeRepair on: Karpenter repairs its own nodes. Every Machine bound to
//     a NodeClaim (label node.cluster.x-k8s.io/karpenter-member, both modes)
//     gets Cluster API's cluster.x-k8s.io/skip-remediation annotation, which
//     MachineHealthChecks honour (they still report the Machine unhealthy,
//     and go on remediating every other Machine they select). The
//     annotation karpenter.cluster.x-k8s.io/skip-remediation records that
//     the provider set it.
//   - NodeRepair off: MachineHealthChecks remediate, as without Karpenter.
//     The provider removes skip-remediation from the Machines where it set
//     it (the record above), and only there: one a user set is kept.
//
// Machines without the member label are never touched.
package remediation

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	controllerruntime "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
)

// SetByProviderAnnotation records on a Machine that the provider set
// clusterv1.MachineSkipRemediationAnnotation (value: why).
const SetByProviderAnnotation = v1alpha1.Group + "/skip-remediation"

// setByNodeRepair is the value of SetByProviderAnnotation.
const setByNodeRepair = "NodeRepair"

// ReasonRemediationHandedToKarpenter is the reason of the event on a Machine
// the first time the provider sets skip-remediation on it.
const ReasonRemediationHandedToKarpenter = "RemediationByKarpenter"

// Controller sets or removes skip-remediation on Karpenter's Machines.
type Controller struct {
	hub        *hub.Hub
	nodeRepair bool
	events     record.EventRecorder
}

// NewController returns the controller; nodeRepair is whether Karpenter's
// NodeRepair feature gate is on.
func NewController(h *hub.Hub, nodeRepair bool) *Controller {
	return &Controller{hub: h, nodeRepair: nodeRepair}
}

// Name of the controller.
func (c *Controller) Name() string { return "machine.remediation" }

// Register watches the hub's Karpenter Machines.
func (c *Controller) Register(_ context.Context, m manager.Manager) error {
	c.events = c.hub.GetEventRecorderFor(hub.FieldManager) //nolint:staticcheck // the recorder core uses too
	return controllerruntime.NewControllerManagedBy(m).
		Named(c.Name()).
		WatchesRawSource(source.Kind(c.hub.GetCache(), client.Object(&clusterv1.Machine{}), &handler.EnqueueRequestForObject{},
			predicate.NewPredicateFuncs(func(o client.Object) bool {
				_, member := o.GetLabels()[v1alpha1.KarpenterMemberLabel]
				return member || o.GetAnnotations()[SetByProviderAnnotation] != ""
			}))).
		Complete(c)
}

// Desired is what the Machine's annotations should be, and whether they
// differ from what it has: the rule of the package doc.
func Desired(m *clusterv1.Machine, nodeRepair bool) (map[string]*string, bool) {
	_, member := m.Labels[v1alpha1.KarpenterMemberLabel]
	_, skip := m.Annotations[clusterv1.MachineSkipRemediationAnnotation]
	ours := m.Annotations[SetByProviderAnnotation] != ""
	switch {
	case nodeRepair && member && !skip:
		v, why := "", setByNodeRepair
		return map[string]*string{clusterv1.MachineSkipRemediationAnnotation: &v, SetByProviderAnnotation: &why}, true
	case (!nodeRepair || !member) && ours:
		// Set by us for a reason that no longer holds: give the Machine
		// back to its MachineHealthChecks.
		return map[string]*string{clusterv1.MachineSkipRemediationAnnotation: nil, SetByProviderAnnotation: nil}, true
	}
	return nil, false
}

// Reconcile brings one Machine's annotations to Desired.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	m := &clusterv1.Machine{}
	if err := c.hub.GetClient().Get(ctx, req.NamespacedName, m); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !m.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	change, ok := Desired(m, c.nodeRepair)
	if !ok {
		return reconcile.Result{}, nil
	}
	patch := client.MergeFrom(m.DeepCopy())
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	for k, v := range change {
		if v == nil {
			delete(m.Annotations, k)
		} else {
			m.Annotations[k] = *v
		}
	}
	if err := c.hub.GetClient().Patch(ctx, m, patch); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(fmt.Errorf("Machine %s: setting %s: %w", req.NamespacedName, clusterv1.MachineSkipRemediationAnnotation, err))
	}
	if _, set := m.Annotations[clusterv1.MachineSkipRemediationAnnotation]; set {
		log.FromContext(ctx).V(1).Info("Machine left to Karpenter's node repair", "Machine", req.NamespacedName.String())
		if c.events != nil {
			c.events.Event(m, corev1.EventTypeNormal, ReasonRemediationHandedToKarpenter,
				"Karpenter's node repair (NodeRepair) replaces this node when unhealthy; MachineHealthChecks skip it ("+clusterv1.MachineSkipRemediationAnnotation+")")
		}
	} else {
		log.FromContext(ctx).V(1).Info("Machine given back to MachineHealthChecks", "Machine", req.NamespacedName.String())
	}
	return reconcile.Result{}, nil
}
