// Package machinegone replaces, at once, a NodeClaim whose Machine was
// deleted before its Node registered.
//
// A launch returns once the instance has an ID, before it boots. If its
// Machine is deleted meanwhile by someone else (a scale-down of the
// MachineDeployment that picked a Machine still provisioning, a
// MachineHealthCheck, a rollout replacing the MachineSet, a user), the
// NodeClaim has nothing left to register, and Karpenter core would wait for
// its registration timeout (15 minutes) before replacing it; its pods wait
// as long. Core's own garbage collection only takes registered NodeClaims.
// The AWS provider closes the same gap with EC2's instance state-change
// events; here the hub's Machine deletions are the events.
//
// The NodeClaim is deleted only when its Machine (named on the NodeClaim at
// launch) is being deleted, or a live read of the management cluster says
// it does not exist: a cache that lags or an API error never deletes one.
// Core then deletes it the usual way (the mode's Delete finds the Machine
// leaving and changes no replicas) and launches a replacement for its pods.
package machinegone

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	controllerruntime "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
	"github.com/autonode/karpenter-clusterapi/pkg/spoke"
)

// ReasonMachineGone is the reason of the event on the NodeClaim.
const ReasonMachineGone = "MachineGone"

// recheck is how often a launched, unregistered NodeClaim is looked at
// again without an event (a deletion missed while the hub was unreachable).
const recheck = time.Minute

// Finder finds a NodeClaim's Machine: nil only when a live read says it
// does not exist (hub.Lookup).
type Finder interface {
	Find(ctx context.Context, claim string, machine *types.NamespacedName, providerID string) (*clusterv1.Machine, error)
}

// Controller deletes NodeClaims whose Machine went before their Node
// registered.
type Controller struct {
	kubeClient client.Client
	hub        *hub.Hub
	machines   Finder
	recorder   record.EventRecorder
}

// NewController returns the controller; kubeClient is the workload
// cluster's.
func NewController(kubeClient client.Client, h *hub.Hub, machines Finder) *Controller {
	return &Controller{kubeClient: kubeClient, hub: h, machines: machines}
}

// Name of the controller.
func (c *Controller) Name() string { return "nodeclaim.machinegone" }

// Register watches the provider's NodeClaims and the hub's Machines: a
// Machine's deletion wakes the NodeClaim it is bound to.
func (c *Controller) Register(_ context.Context, m manager.Manager) error {
	c.recorder = m.GetEventRecorderFor("karpenter-clusterapi") //nolint:staticcheck // the recorder core uses too
	return controllerruntime.NewControllerManagedBy(m).
		Named(c.Name()).
		For(&karpv1.NodeClaim{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			nc, ok := o.(*karpv1.NodeClaim)
			return ok && spoke.Ours(nc)
		}))).
		WatchesRawSource(source.Kind(c.hub.GetCache(), client.Object(&clusterv1.Machine{}), handler.Funcs{
			UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				if !e.ObjectNew.GetDeletionTimestamp().IsZero() && e.ObjectOld.GetDeletionTimestamp().IsZero() {
					enqueueClaim(e.ObjectNew, q)
				}
			},
			DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				enqueueClaim(e.Object, q)
			},
		})).
		Complete(c)
}

func enqueueClaim(m client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if claim := m.GetAnnotations()[v1alpha1.NodeClaimAnnotation]; claim != "" {
		q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: claim}})
	}
}

// Reconcile looks at one NodeClaim.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	nc := &karpv1.NodeClaim{}
	if err := c.kubeClient.Get(ctx, req.NamespacedName, nc); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !nc.DeletionTimestamp.IsZero() || !spoke.Ours(nc) || nc.Status.ProviderID == "" ||
		nc.StatusConditions().IsTrue(karpv1.ConditionTypeRegistered) {
		// Not launched yet (the launch handles its Machine), registered
		// (core's garbage collection handles it), or leaving.
		return reconcile.Result{}, nil
	}
	key, ok := machineOf(nc)
	if !ok {
		return reconcile.Result{}, nil // no Machine named: nothing to be sure of
	}
	m, err := c.machines.Find(ctx, nc.Name, &key, "")
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("NodeClaim %s: %w", nc.Name, err)
	}
	var why string
	switch {
	case m == nil:
		why = fmt.Sprintf("Machine %s was deleted before its Node registered", key)
	case !m.DeletionTimestamp.IsZero():
		why = fmt.Sprintf("Machine %s is being deleted before its Node registered", key)
	default:
		return reconcile.Result{RequeueAfter: recheck}, nil
	}
	if err := c.kubeClient.Delete(ctx, nc, client.Preconditions{UID: &nc.UID}); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	log.FromContext(ctx).Info("deleting NodeClaim whose Machine is gone", "NodeClaim", nc.Name, "Machine", key.String())
	if c.recorder != nil {
		c.recorder.Event(nc, corev1.EventTypeWarning, ReasonMachineGone,
			why+" (a scale-down, a MachineHealthCheck, a rollout or a user): NodeClaim deleted so Karpenter replaces it now, not after its registration timeout")
	}
	metrics.NodeClaimsMachineGone.Inc()
	return reconcile.Result{}, nil
}

// machineOf reads the Machine recorded on the NodeClaim at launch.
func machineOf(nc *karpv1.NodeClaim) (types.NamespacedName, bool) {
	ns, name, ok := v1alpha1.MachineRef(nc.Annotations)
	if !ok {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: ns, Name: name}, true
}
