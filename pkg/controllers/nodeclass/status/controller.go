// Package status keeps each ClusterAPINodeClass's status true: Ready when its
// selection resolves to at least one usable MachineDeployment or template in
// scope, and which instance types it resolves to. Karpenter uses a NodePool
// only while its NodeClass is Ready, so this is what users see first.
package status

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/awslabs/operatorpkg/reasonable"
	"k8s.io/apimachinery/pkg/api/equality"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	controllerruntime "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	"sigs.k8s.io/karpenter/pkg/operator/injection"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/controllers/signal"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
)

// Resolution is what a NodeClass's selection resolves to.
type Resolution struct {
	// InstanceTypes are the names of the usable instance types.
	InstanceTypes []string
	// Problems explain selected objects that could not be used, each naming
	// the object and the field.
	Problems []string
	// EstimatedPrices are instance types priced by estimate.
	EstimatedPrices []string
	// DriftHash changes when what new nodes are made from changes.
	DriftHash string
	// Unavailable are offerings left out after a capacity failure.
	Unavailable []v1alpha1.UnavailableOffering
}

// Resolver resolves a NodeClass against the hub.
type Resolver interface {
	Resolve(ctx context.Context, nodeClass *v1alpha1.ClusterAPINodeClass) (Resolution, error)
}

// transientError marks a resolution failure that says nothing about the
// NodeClass (the hub cannot be read): the status is left as it was.
type transientError struct{ err error }

func (e *transientError) Error() string { return e.err.Error() }
func (e *transientError) Unwrap() error { return e.err }

// Transient wraps an error as transient.
func Transient(err error) error { return &transientError{err: err} }

// IsTransient reports whether err is (or wraps) a transient error.
func IsTransient(err error) bool { return errors.As(err, new(*transientError)) }

// Reasons of the InstanceTypesResolved condition.
const (
	ReasonResolved         = "Resolved"
	ReasonNothingSelected  = "NothingSelected"
	ReasonResolutionFailed = "ResolutionFailed"
	ReasonPricesEstimated  = "Estimated"
	ReasonPricesAnnotated  = "Annotated"
)

// resyncPeriod bounds how stale a status can get for changes no watch sees
// (for example templates of a kind the hub cache does not watch).
const resyncPeriod = 5 * time.Minute

// Controller reconciles ClusterAPINodeClass status.
type Controller struct {
	kubeClient client.Client
	hub        *hub.Hub
	resolver   Resolver
	changes    <-chan struct{}
	recorder   record.EventRecorder
}

// NewController returns the status controller. changes signals that what
// the resolver reads changed.
func NewController(kubeClient client.Client, h *hub.Hub, resolver Resolver, changes <-chan struct{}) *Controller {
	return &Controller{kubeClient: kubeClient, hub: h, resolver: resolver, changes: changes}
}

// Name of the controller.
func (c *Controller) Name() string { return "nodeclass.status" }

// Reconcile resolves the NodeClass and writes its status.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	ctx = injection.WithControllerName(ctx, c.Name())
	nodeClass := &v1alpha1.ClusterAPINodeClass{}
	if err := c.kubeClient.Get(ctx, req.NamespacedName, nodeClass); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !nodeClass.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	stored := nodeClass.DeepCopy()
	res, resolveErr := c.resolver.Resolve(ctx, nodeClass)
	c.announceProblems(nodeClass, res.Problems)
	conditions := nodeClass.StatusConditions()
	if resolveErr != nil && errors.As(resolveErr, new(*transientError)) {
		// The hub cannot be read right now: what was resolved before still
		// holds. Flipping to not Ready would make Karpenter delete NodeClaims
		// that are launching.
		return reconcile.Result{}, resolveErr
	}
	switch {
	case resolveErr != nil:
		conditions.SetFalse(v1alpha1.ConditionTypeInstanceTypesResolved, ReasonResolutionFailed, truncate(resolveErr.Error()))
	case len(res.InstanceTypes) == 0:
		conditions.SetFalse(v1alpha1.ConditionTypeInstanceTypesResolved, ReasonNothingSelected, truncate(nothingMessage(nodeClass, c.hub.Scope, res.Problems)))
	default:
		msg := ""
		if len(res.Problems) > 0 {
			msg = "some selected objects are not usable: " + strings.Join(res.Problems, "; ")
		}
		conditions.SetTrueWithReason(v1alpha1.ConditionTypeInstanceTypesResolved, ReasonResolved, truncate(msg))
	}
	if err := c.setTopologyCondition(ctx, nodeClass); err != nil {
		return reconcile.Result{}, err // a hub read failed: keep the status as it is
	}
	nodeClass.Status.InstanceTypes = res.InstanceTypes
	nodeClass.Status.InstanceTypeCount = int32(len(res.InstanceTypes))
	nodeClass.Status.EstimatedPrices = res.EstimatedPrices
	nodeClass.Status.DriftHash = res.DriftHash
	nodeClass.Status.UnavailableOfferings = res.Unavailable
	if len(res.EstimatedPrices) > 0 {
		conditions.SetFalse(v1alpha1.ConditionTypePricesConfigured, ReasonPricesEstimated, truncate(fmt.Sprintf(
			"priced by a resource-based estimate: %s; set the annotations %s and %s on their MachineDeployments or infrastructure templates",
			strings.Join(res.EstimatedPrices, ", "), v1alpha1.PriceAnnotation, v1alpha1.SpotPriceAnnotation)))
	} else if resolveErr == nil {
		conditions.SetTrueWithReason(v1alpha1.ConditionTypePricesConfigured, ReasonPricesAnnotated, "")
	}
	if !equality.Semantic.DeepEqual(stored.Status, nodeClass.Status) {
		if err := c.kubeClient.Status().Patch(ctx, nodeClass, client.MergeFromWithOptions(stored, client.MergeFromWithOptimisticLock{})); err != nil {
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				return reconcile.Result{Requeue: true}, nil
			}
			return reconcile.Result{}, fmt.Errorf("patching status of ClusterAPINodeClass %s: %w", nodeClass.Name, err)
		}
	}
	if resolveErr != nil {
		// A hub outage or a bad selector: retry with backoff, the condition says why.
		return reconcile.Result{}, resolveErr
	}
	return reconcile.Result{RequeueAfter: resyncPeriod}, nil
}

// announceProblems publishes an event per problem not announced before (the
// condition message holds the ones already known), so users see each bad
// object once in `kubectl describe`, not at every resync.
func (c *Controller) announceProblems(nc *v1alpha1.ClusterAPINodeClass, problems []string) {
	if c.recorder == nil {
		return
	}
	known := ""
	if cond := nc.StatusConditions().Get(v1alpha1.ConditionTypeInstanceTypesResolved); cond != nil {
		known = cond.Message
	}
	for _, p := range problems {
		if !strings.Contains(known, p) {
			c.recorder.Event(nc, "Warning", "SelectionProblem", truncate(p))
		}
	}
}

func nothingMessage(nc *v1alpha1.ClusterAPINodeClass, scope hub.Scope, problems []string) string {
	where := "in any namespace"
	if scope.Namespace != "" {
		where = fmt.Sprintf("in namespace %q", scope.Namespace)
	}
	if scope.ClusterName != "" {
		where += fmt.Sprintf(" of Cluster %q", scope.ClusterName)
	}
	var what string
	if nc.Spec.MachineTemplate != nil {
		t := nc.Spec.MachineTemplate.InfrastructureTemplates
		what = fmt.Sprintf("no %s (%s) labelled %s matches spec.machineTemplate.infrastructureTemplates.selector %s", t.Kind, t.APIGroup, v1alpha1.KarpenterMemberLabel, where)
	} else {
		what = fmt.Sprintf("no MachineDeployment labelled %s matches spec.scalableResourceSelector %s", v1alpha1.KarpenterMemberLabel, where)
	}
	if len(problems) > 0 {
		what += "; not usable: " + strings.Join(problems, "; ")
	}
	return what
}

func truncate(s string) string {
	const max = 2048
	if len(s) > max {
		return s[:max-3] + "..."
	}
	return s
}

// Register watches NodeClasses in the workload cluster and what they
// resolve to in the hub: a change to either can change readiness.
func (c *Controller) Register(ctx context.Context, m manager.Manager) error {
	c.recorder = m.GetEventRecorderFor("karpenter-clusterapi") //nolint:staticcheck // the events API recorder needs a different sink; core uses this one too
	events := signal.Events(ctx, c.changes, &v1alpha1.ClusterAPINodeClass{})
	return controllerruntime.NewControllerManagedBy(m).
		Named(c.Name()).
		For(&v1alpha1.ClusterAPINodeClass{}).
		WatchesRawSource(source.Channel(events, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
			return c.allNodeClasses(ctx)
		}))).
		WatchesRawSource(c.clusterChanges()).
		WithOptions(controller.Options{
			RateLimiter:             reasonable.RateLimiter(),
			MaxConcurrentReconciles: 1,
		}).
		Complete(c)
}

func (c *Controller) allNodeClasses(ctx context.Context) []reconcile.Request {
	list := &v1alpha1.ClusterAPINodeClassList{}
	if err := c.kubeClient.List(ctx, list); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}})
	}
	return reqs
}
