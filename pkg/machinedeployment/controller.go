package machinedeployment

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	controllerruntime "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/kubelet"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
)

// templateResync re-reads infrastructure templates of kinds the cache does
// not watch by type.
const templateResync = 5 * time.Minute

// Controller keeps each MachineDeployment's instance-type Source current,
// binds new Machines to the NodeClaims replicas were raised for, and gives
// back replicas and Machines whose NodeClaim is gone.
type Controller struct {
	provider *Provider
	spoke    client.Reader // cached NodeClaims
	spokeAPI client.Reader // live reads to confirm a NodeClaim is gone
	// hubEvents and spokeEvents record events on Machines (hub) and NodeClaims (spoke).
	hubEvents, spokeEvents record.EventRecorder
	// bootstrapWatched is true when KubeadmConfigTemplate changes are watched.
	bootstrapWatched bool
	// seen times the graces of the pass (observations only).
	seen firstSeen
	// unowned remembers the last count of Machines no NodeClaim owns.
	unowned unownedReport
	// readLive holds the MachineDeployments this process has read live
	// once (see pass).
	readLive sync.Map
	// templates remembers each MachineDeployment's rollout fields, to wake
	// the NodeClass status (and with it drift) when they change.
	templates sync.Map // types.NamespacedName -> string
}

// NewController returns the controller. It also primes the provider's
// instance-type store from the hub on first use.
func NewController(p *Provider, spoke, spokeAPI client.Reader) *Controller {
	c := &Controller{provider: p, spoke: spoke, spokeAPI: spokeAPI}
	// Launch reads NodeClaims too, to take over the reservation of one
	// that is gone (takeovers).
	p.spoke, p.spokeAPI = spoke, spokeAPI
	p.store.SetPrimer(c.prime)
	return c
}

// prime computes the Source of every member MachineDeployment in scope, as
// the reconciler would, so the store is complete before anyone trusts it.
func (c *Controller) prime(ctx context.Context) error {
	list := &clusterv1.MachineDeploymentList{}
	sel := hub.HasLabel(labels.Everything(), v1alpha1.KarpenterMemberLabel)
	if err := c.provider.hub.GetCache().List(ctx, list, c.provider.hub.Scope.ListOptions(sel)...); err != nil {
		return err
	}
	for i := range list.Items {
		md := &list.Items[i]
		if !c.provider.hub.Scope.Contains(md, md.Spec.ClusterName) {
			continue
		}
		template, _, err := c.infraTemplate(ctx, md)
		if err != nil {
			log.FromContext(ctx).Error(err, "reading infrastructure template", "MachineDeployment", client.ObjectKeyFromObject(md))
		}
		bootstrap, err := c.bootstrapTemplate(ctx, md)
		if err != nil {
			log.FromContext(ctx).Error(err, "reading bootstrap template", "MachineDeployment", client.ObjectKeyFromObject(md))
		}
		src := instancetype.FromMachineDeploymentTemplates(md, template, bootstrap)
		if _, err := readRecords(md); err != nil && src.Err == nil {
			src.Err = err
		}
		c.provider.store.Put(src)
	}
	return nil
}

// hasRecords reports whether Karpenter keeps records on a MachineDeployment.
func hasRecords(md *clusterv1.MachineDeployment) bool {
	for _, k := range []string{OwnedReplicasAnnotation, PendingAnnotation, HeldReplicasAnnotation} {
		if _, ok := md.Annotations[k]; ok {
			return true
		}
	}
	return false
}

// Name of the controller.
func (c *Controller) Name() string { return "machinedeployment" }

// Register watches MachineDeployments, their Machines, AWSMachineTemplates
// and (when the hub serves them) KubeadmConfigTemplates in the hub.
func (c *Controller) Register(_ context.Context, m manager.Manager) error {
	h := c.provider.hub
	c.hubEvents = h.GetEventRecorderFor(eventSource)   //nolint:staticcheck // the recorder core uses too
	c.spokeEvents = m.GetEventRecorderFor(eventSource) //nolint:staticcheck // the recorder core uses too
	b := controllerruntime.NewControllerManagedBy(m)
	if mapping, err := h.GetRESTMapper().RESTMapping(kubeadmConfigTemplate); err == nil {
		// Read as unstructured, at the version the hub serves: the same
		// informer serves bootstrapTemplate's reads.
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(mapping.GroupVersionKind)
		b = b.WatchesRawSource(source.Kind(h.GetCache(), u,
			handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, t *unstructured.Unstructured) []reconcile.Request {
				return c.mdsUsingBootstrapTemplate(ctx, t.GetNamespace(), t.GetName())
			})))
		c.bootstrapWatched = true
	}
	// Launch and the NodeClaim watch queue a MachineDeployment directly.
	wake := make(chan event.TypedGenericEvent[*clusterv1.MachineDeployment], 1024)
	c.provider.wake = func(key types.NamespacedName) {
		select {
		case wake <- event.TypedGenericEvent[*clusterv1.MachineDeployment]{Object: &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}}:
		default: // full: the MachineDeployment's own events queue it too
		}
	}
	return b.
		Named(c.Name()).
		WatchesRawSource(source.Channel(wake, &handler.TypedEnqueueRequestForObject[*clusterv1.MachineDeployment]{})).
		WatchesRawSource(source.Kind(h.GetCache(), &clusterv1.MachineDeployment{}, &handler.TypedEnqueueRequestForObject[*clusterv1.MachineDeployment]{})).
		WatchesRawSource(source.Kind(h.GetCache(), &clusterv1.Machine{}, c.machineHandler())).
		WatchesRawSource(source.Kind(h.GetCache(), &infrav1.AWSMachineTemplate{},
			handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, t *infrav1.AWSMachineTemplate) []reconcile.Request {
				return c.mdsUsingTemplate(ctx, infrav1.GroupVersion.Group, "AWSMachineTemplate", t.Namespace, t.Name)
			}))).
		// A NodeClaim deleted while reserved (Karpenter's launch timeout)
		// is seen at once, so that its replica is held before Karpenter's
		// next NodeClaim for the same pods reserves (and takes it).
		WatchesRawSource(source.Kind(m.GetCache(), &karpv1.NodeClaim{}, c.nodeClaimHandler())).
		WithOptions(controller.Options{MaxConcurrentReconciles: 10}).
		Complete(c)
}

// nodeClaimHandler wakes the Launch of a NodeClaim whose deletion begins
// or ends (it stops waiting: no Machine is bound to a NodeClaim being
// deleted), and queues the MachineDeployments holding a reservation for a
// NodeClaim that is deleted.
func (c *Controller) nodeClaimHandler() handler.TypedEventHandler[*karpv1.NodeClaim, reconcile.Request] {
	return handler.TypedFuncs[*karpv1.NodeClaim, reconcile.Request]{
		UpdateFunc: func(_ context.Context, e event.TypedUpdateEvent[*karpv1.NodeClaim], _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if e.ObjectOld.DeletionTimestamp.IsZero() && !e.ObjectNew.DeletionTimestamp.IsZero() {
				c.provider.waiters.Notify(e.ObjectNew.Name)
			}
		},
		DeleteFunc: func(ctx context.Context, e event.TypedDeleteEvent[*karpv1.NodeClaim], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			c.provider.waiters.Notify(e.Object.Name)
			mds := &clusterv1.MachineDeploymentList{}
			if err := c.provider.hub.GetCache().List(ctx, mds, client.MatchingFields{hub.IndexMachineDeploymentPendingClaim: e.Object.Name}); err != nil {
				return // the MachineDeployment's own requeue finds it gone later
			}
			for i := range mds.Items {
				q.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&mds.Items[i])})
			}
		},
	}
}

// machineHandler wakes Launch waiters on every change of a bound Machine and
// queues the MachineDeployment of an unbound one for binding.
func (c *Controller) machineHandler() handler.TypedEventHandler[*clusterv1.Machine, reconcile.Request] {
	enqueue := func(m *clusterv1.Machine, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		if claim := m.Annotations[v1alpha1.NodeClaimAnnotation]; claim != "" {
			c.provider.waiters.Notify(claim)
		}
		if md := m.Labels[clusterv1.MachineDeploymentNameLabel]; md != "" {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: m.Namespace, Name: md}})
		}
	}
	return handler.TypedFuncs[*clusterv1.Machine, reconcile.Request]{
		CreateFunc: func(_ context.Context, e event.TypedCreateEvent[*clusterv1.Machine], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.Object, q)
		},
		UpdateFunc: func(_ context.Context, e event.TypedUpdateEvent[*clusterv1.Machine], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.ObjectNew, q)
		},
		DeleteFunc: func(ctx context.Context, e event.TypedDeleteEvent[*clusterv1.Machine], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			m := e.Object
			go func() {
				if err := c.provider.MachineDeleted(context.WithoutCancel(ctx), m); err != nil {
					log.FromContext(ctx).Error(err, "reclaiming the replica of a bound Machine someone else deleted", "Machine", client.ObjectKeyFromObject(m))
				}
			}()
			enqueue(m, q)
		},
	}
}

// kubeadmConfigTemplate is the bootstrap template kind whose kubelet
// arguments decide allocatable (see pkg/kubelet).
var kubeadmConfigTemplate = schema.GroupKind{Group: kubelet.KubeadmGroup, Kind: kubelet.KubeadmConfigTemplateKind}

func (c *Controller) mdsUsingBootstrapTemplate(ctx context.Context, namespace, name string) []reconcile.Request {
	list := &clusterv1.MachineDeploymentList{}
	if err := c.provider.hub.GetCache().List(ctx, list, client.InNamespace(namespace),
		client.MatchingFields{hub.IndexMachineDeploymentBootstrapTemplate: hub.InfraTemplateKey(kubeadmConfigTemplate.Group, kubeadmConfigTemplate.Kind, name)}); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}

func (c *Controller) mdsUsingTemplate(ctx context.Context, group, kind, namespace, name string) []reconcile.Request {
	list := &clusterv1.MachineDeploymentList{}
	if err := c.provider.hub.GetCache().List(ctx, list, client.InNamespace(namespace),
		client.MatchingFields{hub.IndexMachineDeploymentInfraTemplate: hub.InfraTemplateKey(group, kind, name)}); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}

// Reconcile refreshes one MachineDeployment's Source and bookkeeping. A
// key that failed because a cluster is unreachable is looked at again
// within hub.RetryAfterOutage, not after its exponential backoff, so the
// controller resumes within seconds of the cluster's return.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	res, err := c.reconcile(ctx, req)
	if err != nil {
		after, err := hub.OutageResult(err)
		return reconcile.Result{RequeueAfter: after}, err
	}
	return res, nil
}

func (c *Controller) reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	h := c.provider.hub
	md := &clusterv1.MachineDeployment{}
	if err := h.GetCache().Get(ctx, req.NamespacedName, md); err != nil {
		if apierrors.IsNotFound(err) {
			c.provider.store.Delete(req.NamespacedName)
			c.templates.Delete(req.NamespacedName)
			metrics.UnownedMachines.DeleteLabelValues(req.Namespace, req.Name)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if !h.Scope.Contains(md, md.Spec.ClusterName) {
		c.provider.store.Delete(req.NamespacedName)
		c.templates.Delete(req.NamespacedName)
		return reconcile.Result{}, nil
	}
	if _, member := md.Labels[v1alpha1.KarpenterMemberLabel]; !member {
		// No longer offered, but what Karpenter started on it completes:
		// reservations are bound or given back, releases lowered.
		c.provider.store.Delete(req.NamespacedName)
		c.templates.Delete(req.NamespacedName)
		metrics.UnownedMachines.DeleteLabelValues(req.Namespace, req.Name)
		if !hasRecords(md) {
			return reconcile.Result{}, nil
		}
		requeue, err := c.pass(ctx, md, false)
		return reconcile.Result{RequeueAfter: requeue}, err
	}
	template, typed, err := c.infraTemplate(ctx, md)
	if err != nil {
		log.FromContext(ctx).Error(err, "reading infrastructure template", "MachineDeployment", req.NamespacedName)
	}
	bootstrap, err := c.bootstrapTemplate(ctx, md)
	if err != nil {
		log.FromContext(ctx).Error(err, "reading bootstrap template", "MachineDeployment", req.NamespacedName)
	}
	if ref := md.Spec.Template.Spec.Bootstrap.ConfigRef; ref.Kind == kubeadmConfigTemplate.Kind && !c.bootstrapWatched {
		typed = false // its changes are not watched: look again later
	}
	src := instancetype.FromMachineDeploymentTemplates(md, template, bootstrap)
	if _, err := readRecords(md); err != nil && src.Err == nil {
		// Its records cannot be read: not offered until fixed (a NodeClass
		// problem and event name the MachineDeployment and annotation).
		src.Err = fmt.Errorf("%w; fix or remove the annotation (removed, Karpenter counts its replicas again from the bound Machines)", err)
	}
	c.provider.store.Put(src)
	// A new template may yield the same instance type (no store change):
	// wake the NodeClass status anyway, its driftHash changes.
	if rk := rolloutKey(md); func() bool { old, ok := c.templates.Swap(req.NamespacedName, rk); return !ok || old != rk }() {
		c.provider.store.Notify()
	}

	requeue, err := c.pass(ctx, md, true)
	if err != nil {
		return reconcile.Result{}, err
	}
	if !typed && requeue == 0 {
		requeue = templateResync
	}
	return reconcile.Result{RequeueAfter: requeue}, nil
}

// infraTemplate reads the MachineDeployment's infrastructure template from
// the cache; typed reports whether its kind's changes are watched.
func (c *Controller) infraTemplate(ctx context.Context, md *clusterv1.MachineDeployment) (*unstructured.Unstructured, bool, error) {
	ref := md.Spec.Template.Spec.InfrastructureRef
	if ref.Name == "" {
		return nil, true, nil
	}
	gk := schema.GroupKind{Group: ref.APIGroup, Kind: ref.Kind}
	typed := gk == schema.GroupKind{Group: infrav1.GroupVersion.Group, Kind: "AWSMachineTemplate"}
	mapping, err := c.provider.hub.GetRESTMapper().RESTMapping(gk)
	if err != nil {
		return nil, typed, fmt.Errorf("MachineDeployment %s/%s: spec.template.spec.infrastructureRef kind %s: %w", md.Namespace, md.Name, gk, err)
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(mapping.GroupVersionKind)
	if typed {
		t := &infrav1.AWSMachineTemplate{}
		if err := c.provider.hub.GetCache().Get(ctx, types.NamespacedName{Namespace: md.Namespace, Name: ref.Name}, t); err != nil {
			return nil, typed, fmt.Errorf("MachineDeployment %s/%s: infrastructure template %s %s: %w", md.Namespace, md.Name, ref.Kind, ref.Name, err)
		}
		obj, err := toUnstructured(t)
		if err != nil {
			return nil, typed, err
		}
		return obj, typed, nil
	}
	if err := c.provider.hub.GetClient().Get(ctx, types.NamespacedName{Namespace: md.Namespace, Name: ref.Name}, u); err != nil {
		return nil, typed, fmt.Errorf("MachineDeployment %s/%s: infrastructure template %s %s: %w", md.Namespace, md.Name, ref.Kind, ref.Name, err)
	}
	return u, typed, nil
}

// bootstrapTemplate reads the MachineDeployment's bootstrap config template
// when it is a KubeadmConfigTemplate (the kind whose kubelet arguments are
// understood), at the version the hub serves, from the cache.
func (c *Controller) bootstrapTemplate(ctx context.Context, md *clusterv1.MachineDeployment) (*unstructured.Unstructured, error) {
	ref := md.Spec.Template.Spec.Bootstrap.ConfigRef
	if (schema.GroupKind{Group: ref.APIGroup, Kind: ref.Kind}) != kubeadmConfigTemplate || ref.Name == "" {
		return nil, nil
	}
	mapping, err := c.provider.hub.GetRESTMapper().RESTMapping(kubeadmConfigTemplate)
	if err != nil {
		return nil, fmt.Errorf("MachineDeployment %s/%s: spec.template.spec.bootstrap.configRef kind %s: %w", md.Namespace, md.Name, kubeadmConfigTemplate, err)
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(mapping.GroupVersionKind)
	if err := c.provider.hub.GetClient().Get(ctx, types.NamespacedName{Namespace: md.Namespace, Name: ref.Name}, u); err != nil {
		return nil, fmt.Errorf("MachineDeployment %s/%s: bootstrap template %s %s: %w", md.Namespace, md.Name, ref.Kind, ref.Name, err)
	}
	return u, nil
}

// eventSource is the component name on the provider's events.
const eventSource = "karpenter-clusterapi"

func (c *Controller) event(r record.EventRecorder, obj runtime.Object, kind, reason, msg string) {
	if r != nil {
		r.Event(obj, kind, reason, msg)
	}
}
