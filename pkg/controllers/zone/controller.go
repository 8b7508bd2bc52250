// Package zone gives a NodeClaim launched in no particular zone the zone its
// Node registered in. An offering without a zone (a MachineDeployment
// without a failure domain, a template in a Cluster without failure
// domains) cannot say at launch where the infrastructure puts the instance;
// the Node's topology.kubernetes.io/zone label, set by the kubelet or the
// cloud controller manager, can. Karpenter's metrics, events and
// `kubectl get nodeclaims` read the NodeClaim's label.
package zone

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	controllerruntime "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

// nodeClaimProviderIDIndex is the field index Karpenter core registers on
// NodeClaims in the workload cluster's cache.
const nodeClaimProviderIDIndex = "status.providerID"

// Controller copies the Node's zone label to its NodeClaim when the
// NodeClaim has none, and notes every Node's zone in zones.
type Controller struct {
	kubeClient client.Client
	zones      *instancetype.Zones
}

// NewController returns the controller; kubeClient is the workload cluster's.
// zones (may be nil) learns the zone of every Node, its own or not, listed at
// start or registered later: the infrastructure's zones, where an offering
// in no particular zone may have put an instance (instancetype.Zones).
func NewController(kubeClient client.Client, zones *instancetype.Zones) *Controller {
	return &Controller{kubeClient: kubeClient, zones: zones}
}

// Name of the controller.
func (c *Controller) Name() string { return "nodeclaim.zone" }

// Register watches the provider's NodeClaims without a zone label, and
// Nodes (a zone label may come after the NodeClaim learnt its Node).
func (c *Controller) Register(_ context.Context, m manager.Manager) error {
	return controllerruntime.NewControllerManagedBy(m).
		Named(c.Name()).
		For(&karpv1.NodeClaim{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			nc, ok := o.(*karpv1.NodeClaim)
			return ok && needsZone(nc)
		}))).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(c.nodeClaimsOf),
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
				zone := o.GetLabels()[corev1.LabelTopologyZone]
				c.zones.Note(zone) // on the event itself: no Node is missed for want of a NodeClaim
				return zone != ""
			}))).
		Complete(c)
}

func needsZone(nc *karpv1.NodeClaim) bool {
	return nc.Spec.NodeClassRef != nil && nc.Spec.NodeClassRef.Group == v1alpha1.Group &&
		nc.Labels[corev1.LabelTopologyZone] == "" && nc.DeletionTimestamp.IsZero()
}

func (c *Controller) nodeClaimsOf(ctx context.Context, o client.Object) []reconcile.Request {
	node, ok := o.(*corev1.Node)
	if !ok || node.Spec.ProviderID == "" {
		return nil
	}
	list := &karpv1.NodeClaimList{}
	if err := c.kubeClient.List(ctx, list, client.MatchingFields{nodeClaimProviderIDIndex: node.Spec.ProviderID}); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		if needsZone(&list.Items[i]) {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}})
		}
	}
	return out
}

// Reconcile labels one NodeClaim with its Node's zone.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	nc := &karpv1.NodeClaim{}
	if err := c.kubeClient.Get(ctx, req.NamespacedName, nc); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !needsZone(nc) || nc.Status.NodeName == "" {
		return reconcile.Result{}, nil
	}
	node := &corev1.Node{}
	if err := c.kubeClient.Get(ctx, types.NamespacedName{Name: nc.Status.NodeName}, node); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	// Only the NodeClaim's own Node: a name can be reused.
	zone := node.Labels[corev1.LabelTopologyZone]
	if zone == "" || node.Spec.ProviderID != nc.Status.ProviderID {
		return reconcile.Result{}, nil
	}
	patch := client.MergeFrom(nc.DeepCopy())
	if nc.Labels == nil {
		nc.Labels = map[string]string{}
	}
	nc.Labels[corev1.LabelTopologyZone] = zone
	if err := c.kubeClient.Patch(ctx, nc, patch); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(fmt.Errorf("labelling NodeClaim %s with the zone %s of Node %s: %w", nc.Name, zone, node.Name, err))
	}
	return reconcile.Result{}, nil
}
