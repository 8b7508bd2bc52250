package coexistence

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	controllerruntime "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
)

// ConditionTypeSoleScaler is the NodeClass condition of this package.
const ConditionTypeSoleScaler = "SoleScaler"

// Reasons of the condition and the event.
const (
	ReasonSoleScaler                     = "SoleScaler"
	ReasonScaledByAnotherAutoscaler      = "ScaledByAnotherAutoscaler"
	ReasonReplicasChangedByAnotherWriter = "ReplicasChangedByAnotherWriter"
)

// Controller keeps the SoleScaler condition and records the events.
type Controller struct {
	kubeClient client.Client
	hub        *hub.Hub
	hubEvents  record.EventRecorder
	seen       sightings
	// now is the clock (time.Now when nil).
	now func() time.Time
}

func (c *Controller) clock() time.Time {
	if c.now != nil {
		return c.now()
	}
	return time.Now()
}

// NewController returns the controller; kubeClient is the workload
// cluster's.
func NewController(kubeClient client.Client, h *hub.Hub) *Controller {
	return &Controller{kubeClient: kubeClient, hub: h}
}

// Name of the controller.
func (c *Controller) Name() string { return "nodeclass.coexistence" }

// Register watches NodeClasses and the hub's MachineDeployments: any change
// to a MachineDeployment re-checks every NodeClass (there are few).
func (c *Controller) Register(_ context.Context, m manager.Manager) error {
	c.hubEvents = c.hub.GetEventRecorderFor(hub.FieldManager) //nolint:staticcheck // the recorder core uses too
	all := func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		list := &v1alpha1.ClusterAPINodeClassList{}
		if err := c.kubeClient.List(ctx, list); err != nil {
			return
		}
		for i := range list.Items {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}})
		}
	}
	return controllerruntime.NewControllerManagedBy(m).
		Named(c.Name()).
		For(&v1alpha1.ClusterAPINodeClass{}).
		WatchesRawSource(source.Kind(c.hub.GetCache(), client.Object(&clusterv1.MachineDeployment{}), handler.Funcs{
			CreateFunc: func(ctx context.Context, _ event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				all(ctx, q)
			},
			DeleteFunc: func(ctx context.Context, _ event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				all(ctx, q)
			},
			UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				c.recordChange(e.ObjectOld, e.ObjectNew)
				all(ctx, q)
			},
		})).
		Complete(c)
}

// recordChange records the event when someone other than the provider
// changed spec.replicas of a MachineDeployment it scales or that carries
// the autoscaler size annotations.
func (c *Controller) recordChange(oldObj, newObj client.Object) {
	oldMD, ok1 := oldObj.(*clusterv1.MachineDeployment)
	newMD, ok2 := newObj.(*clusterv1.MachineDeployment)
	if !ok1 || !ok2 || oldMD.Spec.Replicas == nil || newMD.Spec.Replicas == nil || *oldMD.Spec.Replicas == *newMD.Spec.Replicas {
		return
	}
	if !Watched(newMD) || ProviderOwnsReplicas(newMD) {
		return
	}
	var autoscalers []Writer
	for _, w := range ReplicaWriters(newMD) {
		if w.Autoscaler() {
			autoscalers = append(autoscalers, w)
		}
	}
	if len(autoscalers) > 0 {
		c.seen.saw(types.NamespacedName{Namespace: newMD.Namespace, Name: newMD.Name}, c.clock(), autoscalers)
	}
	if c.hubEvents == nil {
		return
	}
	c.hubEvents.Event(newMD, corev1.EventTypeWarning, ReasonReplicasChangedByAnotherWriter,
		changeMessage(*oldMD.Spec.Replicas, *newMD.Spec.Replicas, ReplicaWriters(newMD)))
}

// Watched: a member MachineDeployment, or one cluster-autoscaler would
// scale (both size annotations).
func Watched(md *clusterv1.MachineDeployment) bool {
	if _, member := md.Labels[v1alpha1.KarpenterMemberLabel]; member {
		return true
	}
	_, hasMin := md.Annotations[clusterv1.AutoscalerMinSizeAnnotation]
	_, hasMax := md.Annotations[clusterv1.AutoscalerMaxSizeAnnotation]
	return hasMin && hasMax
}

// Reconcile sets the SoleScaler condition of one NodeClass.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	nc := &v1alpha1.ClusterAPINodeClass{}
	if err := c.kubeClient.Get(ctx, req.NamespacedName, nc); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !nc.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	if len(nc.GetConditions()) == 0 {
		// The status controller's first write initializes the
		// conditions with what it resolved; writing SoleScaler before it
		// would make a NodeClass's status arrive in two writes, the first
		// with Ready Unknown (a reader that acts on the first, as
		// Karpenter's own suites do, races the second). Its write wakes
		// this controller.
		return reconcile.Result{}, nil
	}
	stored := nc.DeepCopy()
	var requeue time.Duration
	if nc.Spec.ScalableResourceSelector == nil {
		if nc.StatusConditions().Get(ConditionTypeSoleScaler) == nil {
			return reconcile.Result{}, nil // nothing to say, nothing to clear
		}
		_ = nc.StatusConditions().Clear(ConditionTypeSoleScaler)
	} else {
		scaled, recheck, err := c.scaledByOthers(ctx, nc.Spec.ScalableResourceSelector)
		if err != nil {
			return reconcile.Result{}, err // a hub read failed: leave the condition as it is
		}
		requeue = recheck
		if len(scaled) == 0 {
			nc.StatusConditions().SetTrueWithReason(ConditionTypeSoleScaler, ReasonSoleScaler, "")
		} else {
			nc.StatusConditions().SetFalse(ConditionTypeSoleScaler, ReasonScaledByAnotherAutoscaler, truncate(strings.Join(scaled, "; ")+
				" (or keep the two autoscalers on different node groups)"))
		}
	}
	// Looked at again when the newest sighting leaves the window.
	done := reconcile.Result{RequeueAfter: requeue}
	if equality.Semantic.DeepEqual(stored.Status, nc.Status) {
		return done, nil
	}
	if err := c.kubeClient.Status().Patch(ctx, nc, client.MergeFromWithOptions(stored, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return reconcile.Result{Requeue: true}, nil
		}
		return reconcile.Result{}, fmt.Errorf("patching status of ClusterAPINodeClass %s: %w", nc.Name, err)
	}
	return done, nil
}

// scaledByOthers describes each selected member MachineDeployment whose
// replicas another autoscaler changed within the window, and when the
// first of them leaves it.
func (c *Controller) scaledByOthers(ctx context.Context, selector *metav1.LabelSelector) ([]string, time.Duration, error) {
	sel, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil {
		return nil, 0, nil // the InstanceTypesResolved condition says so
	}
	mds := &clusterv1.MachineDeploymentList{}
	if err := c.hub.GetCache().List(ctx, mds, c.hub.Scope.ListOptions(hub.HasLabel(sel, v1alpha1.KarpenterMemberLabel))...); err != nil {
		return nil, 0, fmt.Errorf("listing MachineDeployments: %w", err)
	}
	now, win := c.clock(), window(ctx)
	var out []string
	var recheck time.Duration
	for i := range mds.Items {
		md := &mds.Items[i]
		if !c.hub.Scope.Contains(md, md.Spec.ClusterName) {
			continue
		}
		seen, found := c.seen.last(md, now)
		msg, left := verdict(md, seen, found, now, win)
		if msg == "" {
			continue
		}
		out = append(out, msg)
		if recheck == 0 || left < recheck {
			recheck = left
		}
	}
	sort.Strings(out)
	return out, recheck, nil
}

func truncate(s string) string {
	const max = 2048
	if len(s) > max {
		return s[:max-3] + "..."
	}
	return s
}
