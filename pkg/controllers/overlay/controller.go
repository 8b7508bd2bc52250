// Package overlay keeps Karpenter core's NodeOverlay evaluation current with
// this provider's catalogue.
//
// Core evaluates every NodeOverlay against the instance types each NodePool
// has at that moment and keeps the result until an overlay, a NodePool's spec
// or a NodeClass's spec changes (or six hours pass). A provider whose
// instance types are fixed never notices. Here they come and go with the
// management cluster's MachineDeployments and templates: an overlay written
// before the MachineDeployment it prices (or evaluated before this process
// had read that MachineDeployment) would silently not apply to it. This
// package runs core's own reconciler under the same name and watches, plus
// one more: every change of the catalogue re-evaluates the overlays.
package overlay

import (
	"context"

	"github.com/awslabs/operatorpkg/controller"
	"github.com/awslabs/operatorpkg/reasonable"
	"github.com/awslabs/operatorpkg/status"
	controllerruntime "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/apis/v1alpha1"
	"sigs.k8s.io/karpenter/pkg/controllers/nodeoverlay"

	"github.com/autonode/karpenter-clusterapi/pkg/controllers/signal"
)

// Controller is core's NodeOverlay controller with one more trigger.
type Controller struct {
	*nodeoverlay.Controller
	kubeClient  client.Client
	nodeClasses []status.Object
	changes     <-chan struct{}
}

// Replace returns ctrls with core's NodeOverlay controller (present when the
// NodeOverlay feature gate is on) swapped for one that also re-evaluates on
// every signal from changes. Without core's controller, ctrls is returned
// as it is: there are no overlays to keep current.
func Replace(ctrls []controller.Controller, kubeClient client.Client, nodeClasses []status.Object, changes <-chan struct{}) []controller.Controller {
	out := make([]controller.Controller, len(ctrls))
	for i, c := range ctrls {
		if core, ok := c.(*nodeoverlay.Controller); ok {
			c = &Controller{Controller: core, kubeClient: kubeClient, nodeClasses: nodeClasses, changes: changes}
		}
		out[i] = c
	}
	return out
}

// Register watches what core's controller watches (NodeOverlays, and the
// spec of NodePools and NodeClasses) and the catalogue's changes.
func (c *Controller) Register(ctx context.Context, m manager.Manager) error {
	events := signal.Events(ctx, c.changes, &v1alpha1.NodeOverlay{})
	enqueue := nodeoverlay.NodeOverlayEventHandler(c.kubeClient)
	b := controllerruntime.NewControllerManagedBy(m).
		Named(c.Name()).
		For(&v1alpha1.NodeOverlay{}).
		Watches(&karpv1.NodePool{}, enqueue).
		WithEventFilter(predicate.GenerationChangedPredicate{}).
		// A raw source takes no event filter: every signal counts.
		WatchesRawSource(source.Channel(events, enqueue)).
		WithOptions(crcontroller.Options{
			MaxConcurrentReconciles: 1,
			RateLimiter:             reasonable.RateLimiter(),
		})
	for _, nodeClass := range c.nodeClasses {
		b.Watches(nodeClass, enqueue)
	}
	return b.Complete(c)
}
