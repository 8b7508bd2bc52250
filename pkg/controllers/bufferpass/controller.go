// Package bufferpass wakes Karpenter core's provisioner when one of the
// provider's NodeClaims launches, so that CapacityBuffer capacity on the new
// node is counted before emptiness consolidation looks at it.
//
// Core records which nodes hold a buffer's virtual pods (what keeps
// emptiness consolidation off them) only in a provisioning pass, keyed by
// the node's providerID. The pass that creates a NodeClaim for buffer pods
// places them on a NodeClaim without a providerID, and nothing but the
// buffer controller's 30-second requeue starts another. An instance that is
// up within seconds of its launch (a MachineDeployment-mode NodeClaim that
// adopts a Machine already booting, a fast infrastructure) is initialized,
// found empty and deleted before that pass, and the buffer's capacity is
// launched again. A pass at launch counts it at once; its cost is a
// scheduling simulation per batch of launches (core's batcher merges
// triggers within its idle window).
package bufferpass

import (
	"context"

	controllerruntime "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/spoke"
)

// Controller calls Trigger when a NodeClaim of the provider gets its
// providerID.
type Controller struct {
	trigger func()
}

// NewController returns the controller; trigger wakes core's provisioner
// (Provisioner.TriggerReconcile).
func NewController(trigger func()) *Controller {
	return &Controller{trigger: trigger}
}

// Name of the controller.
func (c *Controller) Name() string { return "nodeclaim.bufferpass" }

// Register watches NodeClaims for the update that sets status.providerID.
func (c *Controller) Register(_ context.Context, m manager.Manager) error {
	return controllerruntime.NewControllerManagedBy(m).
		Named(c.Name()).
		For(&karpv1.NodeClaim{}, builder.WithPredicates(Launched())).
		Complete(c)
}

// Reconcile wakes the provisioner.
func (c *Controller) Reconcile(context.Context, reconcile.Request) (reconcile.Result, error) {
	c.trigger()
	return reconcile.Result{}, nil
}

// Launched passes the update of one of the provider's NodeClaims that gives
// it a providerID, and nothing else (a restart's initial list included:
// the provisioner's first pass counts those nodes anyway).
func Launched() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
		UpdateFunc: func(e event.UpdateEvent) bool {
			old, ok1 := e.ObjectOld.(*karpv1.NodeClaim)
			cur, ok2 := e.ObjectNew.(*karpv1.NodeClaim)
			return ok1 && ok2 && old.Status.ProviderID == "" && cur.Status.ProviderID != "" && spoke.Ours(cur)
		},
	}
}
