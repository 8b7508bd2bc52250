package machinedeployment

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	"github.com/autonode/karpenter-clusterapi/pkg/spoke"
)

// Timing of the controller's bookkeeping.
const (
	// bindSkew tolerates clock skew between this process and the hub API
	// server when telling Machines created for a claim from older ones.
	bindSkew = 10 * time.Second
	// OrphanGrace is how long a pending replica or a bound Machine may exist
	// without its NodeClaim before it is given back or released.
	OrphanGrace = 30 * time.Second
	// cleanupDelay is how long bookkeeping that changes no count (pending
	// entries of bound claims, released Machines that are gone) may wait to
	// ride along with another write.
	cleanupDelay = 10 * time.Second
	// templateResync re-reads infrastructure templates of kinds the cache
	// does not watch by type.
	templateResync = 5 * time.Minute
)

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
	// debts tracks owned replicas that disagree with the NodeClaims.
	debts debts
	// templates remembers each MachineDeployment's rollout fields, to wake
	// the NodeClass status (and with it drift) when they change.
	templates sync.Map // types.NamespacedName -> string
}

// NewController returns the controller. It also primes the provider's
// instance-type store from the hub on first use.
func NewController(p *Provider, spoke, spokeAPI client.Reader) *Controller {
	c := &Controller{provider: p, spoke: spoke, spokeAPI: spokeAPI}
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
		c.provider.store.Put(instancetype.FromMachineDeploymentTemplates(md, template, bootstrap))
	}
	return nil
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
	return b.
		Named(c.Name()).
		WatchesRawSource(source.Kind(h.GetCache(), &clusterv1.MachineDeployment{}, &handler.TypedEnqueueRequestForObject[*clusterv1.MachineDeployment]{})).
		WatchesRawSource(source.Kind(h.GetCache(), &clusterv1.Machine{}, c.machineHandler())).
		WatchesRawSource(source.Kind(h.GetCache(), &infrav1.AWSMachineTemplate{},
			handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, t *infrav1.AWSMachineTemplate) []reconcile.Request {
				return c.mdsUsingTemplate(ctx, infrav1.GroupVersion.Group, "AWSMachineTemplate", t.Namespace, t.Name)
			}))).
		WithOptions(controller.Options{MaxConcurrentReconciles: 10}).
		Complete(c)
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
		DeleteFunc: func(_ context.Context, e event.TypedDeleteEvent[*clusterv1.Machine], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.Object, q)
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

// Reconcile refreshes one MachineDeployment's Source and bookkeeping.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	h := c.provider.hub
	md := &clusterv1.MachineDeployment{}
	if err := h.GetCache().Get(ctx, req.NamespacedName, md); err != nil {
		if apierrors.IsNotFound(err) {
			c.provider.store.Delete(req.NamespacedName)
			c.templates.Delete(req.NamespacedName)
			c.debts.clear(req.NamespacedName)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	_, member := md.Labels[v1alpha1.KarpenterMemberLabel]
	if !member || !h.Scope.Contains(md, md.Spec.ClusterName) {
		c.provider.store.Delete(req.NamespacedName)
		c.templates.Delete(req.NamespacedName)
		return reconcile.Result{}, nil
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
	c.provider.store.Put(instancetype.FromMachineDeploymentTemplates(md, template, bootstrap))
	// A new template may yield the same instance type (no store change):
	// wake the NodeClass status anyway, its driftHash changes.
	if rk := rolloutKey(md); func() bool { old, ok := c.templates.Swap(req.NamespacedName, rk); return !ok || old != rk }() {
		c.provider.store.Notify()
	}

	requeue, err := c.reconcileBindings(ctx, md)
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

// reconcileBindings binds new Machines to pending NodeClaims, drops pending
// entries that are bound, forgets released Machines that are gone, gives
// back what belongs to NodeClaims that no longer exist, and settles owned
// replicas that no NodeClaim uses (see OwnedReplicasAnnotation). It returns
// when to look again.
func (c *Controller) reconcileBindings(ctx context.Context, md *clusterv1.MachineDeployment) (time.Duration, error) {
	p := c.provider
	key := client.ObjectKeyFromObject(md)
	pending, err := hub.PendingNodeClaims(md)
	if err != nil {
		return 0, err
	}
	pendingCount := int32(len(pending))
	pendingBefore := maps.Clone(pending)
	released, err := hub.ReleasedMachines(md)
	if err != nil {
		return 0, err
	}
	owned, hasOwned, ownedErr := ownedReplicas(md)
	if ownedErr != nil {
		log.FromContext(ctx).Error(ownedErr, "counting the owned replicas again", "MachineDeployment", key)
	}
	machines := &clusterv1.MachineList{}
	if err := p.hub.GetCache().List(ctx, machines, client.InNamespace(md.Namespace),
		client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
		return 0, fmt.Errorf("listing Machines of MachineDeployment %s: %w", key, err)
	}
	newest, err := c.newestMachineSet(ctx, md)
	if err != nil {
		return 0, err
	}
	now := p.now()
	var ops []*op
	var requeue time.Duration
	later := func(d time.Duration) {
		if requeue == 0 || d < requeue {
			requeue = d
		}
	}

	var cleanups []*op
	oldestCleanup := now
	cleanup := func(o *op, since time.Time) {
		cleanups = append(cleanups, o)
		if since.Before(oldestCleanup) {
			oldestCleanup = since
		}
	}

	recentlyBound := func(m *clusterv1.Machine) bool { return p.recent.machineBound(m.Namespace + "/" + m.Name) }
	use := measure(machines.Items, pendingBefore, released, newest, recentlyBound)
	// debt > 0: owned replicas no NodeClaim uses (a Karpenter Machine was
	// deleted by someone else); < 0: NodeClaims hold more than is counted.
	debt := owned - use.bound - pendingCount

	existing := map[string]bool{}
	var candidates []*clusterv1.Machine
	for i := range machines.Items {
		m := &machines.Items[i]
		existing[m.Name] = true
		if claim := m.Annotations[v1alpha1.NodeClaimAnnotation]; claim != "" {
			if since, ok := pending[claim]; ok {
				cleanup(&op{kind: opBound, name: claim}, since)
				delete(pending, claim)
			}
			if gone, err := c.orphaned(ctx, m, claim, now); err != nil {
				return 0, err
			} else if gone {
				log.FromContext(ctx).Info("releasing Machine whose NodeClaim is gone", "Machine", client.ObjectKeyFromObject(m), "NodeClaim", claim)
				c.event(c.hubEvents, m, corev1.EventTypeNormal, "OrphanReleased", fmt.Sprintf("NodeClaim %s is gone: marked for deletion and its replica given back", claim))
				if err := p.markForDeletion(ctx, m); err != nil && err != ErrMachineGone {
					return 0, err
				}
				ops = append(ops, &op{kind: opRelease, name: m.Name})
				metrics.OrphansReleased.WithLabelValues("machine").Inc()
			} else if m.DeletionTimestamp.IsZero() {
				later(OrphanGrace)
			}
			continue
		}
		_, member := m.Labels[v1alpha1.KarpenterMemberLabel]
		_, marked := m.Annotations[clusterv1.DeleteMachineAnnotation]
		if !member && !marked && m.DeletionTimestamp.IsZero() && !recentlyBound(m) {
			candidates = append(candidates, m)
		}
	}
	for name := range released {
		if !existing[name] {
			cleanup(&op{kind: opForget, name: name}, time.Time{})
		}
	}

	// Oldest claim gets the oldest new Machine.
	claims := make([]string, 0, len(pending))
	for claim := range pending {
		claims = append(claims, claim)
	}
	sort.Slice(claims, func(i, j int) bool {
		if !pending[claims[i]].Equal(pending[claims[j]]) {
			return pending[claims[i]].Before(pending[claims[j]])
		}
		return claims[i] < claims[j]
	})
	sort.Slice(candidates, func(i, j int) bool {
		return candidates[i].CreationTimestamp.Before(&candidates[j].CreationTimestamp)
	})
	taken := map[string]bool{} // Machines bound or given back in this pass
	alive := map[string]bool{} // "<ns>/<name>" of Machines not being deleted
	for i := range machines.Items {
		if m := &machines.Items[i]; m.DeletionTimestamp.IsZero() {
			alive[m.Namespace+"/"+m.Name] = true
		}
	}
	for _, claim := range claims {
		since := pending[claim]
		// A Machine bound elsewhere (another MachineSet, or a race) settles
		// it, and so does a binding this process made that the cache does
		// not show yet, unless that Machine went away since: the claim was
		// raised for again and needs another.
		if machine, ok := p.recent.claimMachine(claim, now); ok {
			if alive[machine] {
				cleanup(&op{kind: opBound, name: claim}, since)
				continue
			}
			p.recent.forget(claim)
		}
		if m, err := p.BoundMachine(ctx, claim); err != nil {
			return 0, err
		} else if m != nil {
			cleanup(&op{kind: opBound, name: claim}, since)
			continue
		}
		gone, err := c.nodeClaimGone(ctx, claim, since, now)
		if err != nil {
			return 0, err
		}
		if gone {
			log.FromContext(ctx).Info("giving back replica of a NodeClaim that is gone", "MachineDeployment", key, "NodeClaim", claim)
			// The Machine raised for it may exist already: mark it, or
			// the MachineSet would pick one by its own deletion order,
			// possibly a bound one.
			if victim := pickVictim(use.victims, taken, since.Add(-bindSkew)); victim != nil {
				if err := p.markSpare(ctx, victim); err != nil {
					return 0, err
				}
				taken[victim.Name] = true
			}
			c.event(c.hubEvents, md, corev1.EventTypeNormal, "ReplicaGivenBack", fmt.Sprintf("NodeClaim %s is gone before a Machine was bound to it: replica given back", claim))
			ops = append(ops, &op{kind: opGiveBack, name: claim})
			metrics.OrphansReleased.WithLabelValues("replica").Inc()
			p.inflight.Delete(claim)
			continue
		}
		// Machines raised for NodeClaims come after them; while a replica
		// is spare (its Machine was taken away), any unbound Machine may
		// stand in for it.
		idx := -1
		for i, m := range candidates {
			if taken[m.Name] {
				continue
			}
			if debt > 0 || !m.CreationTimestamp.Time.Before(since.Add(-bindSkew)) {
				idx = i
				break
			}
		}
		if idx < 0 {
			later(OrphanGrace)
			continue
		}
		m := candidates[idx]
		candidates = append(candidates[:idx], candidates[idx+1:]...)
		if err := c.bind(ctx, m, claim); err != nil {
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				later(time.Second)
				continue
			}
			return 0, err
		}
		taken[m.Name] = true
		cleanup(&op{kind: opBound, name: claim}, since)
	}

	var settle *op
	if len(ops) == 0 {
		var wait time.Duration
		if settle, wait, err = c.settleOwned(ctx, md, owned, hasOwned, debt, use, taken, now); err != nil {
			return 0, err
		}
		if wait > 0 {
			later(wait)
		}
		if settle != nil {
			ops = append(ops, settle)
		}
	} else if debt != 0 {
		later(time.Second) // settle once the counting writes are in
	}

	// Bookkeeping that changes no count rides along with the next counting
	// write, or goes alone once it is cleanupDelay old: a burst then costs
	// the MachineDeployment a few writes, not one per bound Machine.
	if len(ops) == 0 && len(cleanups) > 0 {
		if wait := cleanupDelay - now.Sub(oldestCleanup); wait > 0 {
			later(wait)
			cleanups = nil
		}
	}
	ops = append(ops, cleanups...)
	if len(ops) > 0 {
		if err := p.scaler.Apply(ctx, key, ops...); err != nil {
			return 0, err
		}
		if settle != nil && hasOwned {
			c.debts.decided(key, owned, now)
		}
	}
	return requeue, nil
}

// settleOwned decides what to do about owned replicas no NodeClaim uses
// (debt > 0) or NodeClaims holding more than is counted (debt < 0), once
// that has lasted OrphanGrace: give a spare replica back with an unbound
// Machine, forget it when someone else lowered the replicas already, or
// count again. It returns the op to apply (or nil) and when to look again.
func (c *Controller) settleOwned(ctx context.Context, md *clusterv1.MachineDeployment, owned int32, hasOwned bool, debt int32, use usage, taken map[string]bool, now time.Time) (*op, time.Duration, error) {
	key := client.ObjectKeyFromObject(md)
	if !hasOwned {
		return &op{kind: opSetOwned, bound: use.bound, expect: -1}, 0, nil
	}
	if debt == 0 {
		c.debts.clear(key)
		return nil, 0, nil
	}
	since := c.debts.observe(key, debt > 0, now)
	if wait := OrphanGrace - now.Sub(since); wait > 0 {
		return nil, wait, nil
	}
	if c.debts.stale(key, owned, now) {
		return nil, time.Second, nil
	}
	if debt < 0 {
		log.FromContext(ctx).Info("counting owned replicas again", "MachineDeployment", key, "owned", owned, "bound", use.bound)
		return &op{kind: opSetOwned, bound: use.bound, expect: owned}, time.Second, nil
	}
	if victim := pickVictim(use.victims, taken, time.Time{}); victim != nil {
		log.FromContext(ctx).Info("giving back a replica no NodeClaim uses", "MachineDeployment", key, "Machine", victim.Name)
		if err := c.provider.markSpare(ctx, victim); err != nil {
			return nil, 0, err
		}
		c.event(c.hubEvents, md, corev1.EventTypeNormal, "SpareReplicaGivenBack",
			fmt.Sprintf("a Karpenter Machine was deleted by someone else and no NodeClaim took its replica: given back with Machine %s", victim.Name))
		metrics.OrphansReleased.WithLabelValues("spare").Inc()
		return &op{kind: opSpare, expect: owned}, time.Second, nil
	}
	replicas := int32(0)
	if md.Spec.Replicas != nil {
		replicas = *md.Spec.Replicas
	}
	if replicas != use.live {
		// The MachineSet has yet to create or delete Machines: decide on
		// what it settles to.
		return nil, 5 * time.Second, nil
	}
	if len(use.released) > 0 {
		// The MachineSet keeps a Machine whose replica was given back:
		// another Karpenter Machine went in its place (both were marked; a
		// termination interrupted between marking and giving back leaves
		// one so). The spare replica is that Machine's.
		victim := use.released[0]
		log.FromContext(ctx).Info("giving back a replica no NodeClaim uses", "MachineDeployment", key, "Machine", victim.Name)
		c.event(c.hubEvents, md, corev1.EventTypeNormal, "SpareReplicaGivenBack",
			fmt.Sprintf("a Karpenter Machine went in place of Machine %s, released already: its replica given back", victim.Name))
		metrics.OrphansReleased.WithLabelValues("spare").Inc()
		return &op{kind: opSpare, expect: owned}, time.Second, nil
	}
	log.FromContext(ctx).Info("forgetting a replica someone else took away", "MachineDeployment", key, "replicas", replicas, "owned", owned, "bound", use.bound)
	return &op{kind: opForgive, expect: owned}, time.Second, nil
}

// pickVictim returns the first victim not taken and created at or after
// after (zero: any), or nil.
func pickVictim(victims []*clusterv1.Machine, taken map[string]bool, after time.Time) *clusterv1.Machine {
	for _, m := range victims {
		if taken[m.Name] || (!after.IsZero() && m.CreationTimestamp.Time.Before(after)) {
			continue
		}
		return m
	}
	return nil
}

// newestMachineSet returns the name of the MachineDeployment's MachineSet
// whose template matches the MachineDeployment's (as Cluster API decides
// it), or "" when there is none yet.
func (c *Controller) newestMachineSet(ctx context.Context, md *clusterv1.MachineDeployment) (string, error) {
	ms, err := c.provider.machineSets(ctx, md)
	if err != nil {
		return "", err
	}
	if newest := newestOf(md, ms); newest != nil {
		return newest.Name, nil
	}
	return "", nil
}

// eventSource is the component name on the provider's events.
const eventSource = "karpenter-clusterapi"

func (c *Controller) event(r record.EventRecorder, obj runtime.Object, kind, reason, msg string) {
	if r != nil {
		r.Event(obj, kind, reason, msg)
	}
}

// bind labels and annotates a Machine as the NodeClaim's. The patch carries
// no resourceVersion: Cluster API's controllers update a new Machine several
// times in its first seconds, and an optimistic lock would turn each of those
// into a conflict and a second write. Only this controller binds (one leader,
// one reconcile per MachineDeployment at a time) and recent bindings are
// remembered until the cache shows them, so nothing can bind concurrently.
func (c *Controller) bind(ctx context.Context, m *clusterv1.Machine, claim string) error {
	patch := client.MergeFrom(m.DeepCopy())
	if m.Labels == nil {
		m.Labels = map[string]string{}
	}
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Labels[v1alpha1.KarpenterMemberLabel] = ""
	m.Annotations[v1alpha1.NodeClaimAnnotation] = claim
	if err := c.provider.hub.GetClient().Patch(ctx, m, patch); err != nil {
		return fmt.Errorf("binding Machine %s/%s to NodeClaim %s: %w", m.Namespace, m.Name, claim, err)
	}
	c.provider.recent.add(claim, m.Namespace+"/"+m.Name, c.provider.now())
	c.provider.inflight.Delete(claim) // the raised replica is used
	crashPoint(StepBind)
	log.FromContext(ctx).V(1).Info("bound Machine to NodeClaim", "Machine", client.ObjectKeyFromObject(m), "NodeClaim", claim)
	c.provider.waiters.Notify(claim)
	c.event(c.hubEvents, m, corev1.EventTypeNormal, "Bound", "bound to NodeClaim "+claim)
	nc := &karpv1.NodeClaim{}
	if err := c.spoke.Get(ctx, types.NamespacedName{Name: claim}, nc); err == nil {
		c.event(c.spokeEvents, nc, corev1.EventTypeNormal, "MachineBound", fmt.Sprintf("Machine %s/%s of MachineDeployment %s bound", m.Namespace, m.Name, m.Labels[clusterv1.MachineDeploymentNameLabel]))
	}
	return nil
}

// orphaned reports whether a bound Machine's NodeClaim is gone for longer
// than the grace period, and the Machine is not being deleted already.
func (c *Controller) orphaned(ctx context.Context, m *clusterv1.Machine, claim string, now time.Time) (bool, error) {
	if !m.DeletionTimestamp.IsZero() {
		return false, nil
	}
	return c.nodeClaimGone(ctx, claim, m.CreationTimestamp.Time, now)
}

// nodeClaimGone reports whether a NodeClaim is gone for longer than the
// grace period (see spoke.NodeClaimGone).
func (c *Controller) nodeClaimGone(ctx context.Context, claim string, since, now time.Time) (bool, error) {
	return spoke.NodeClaimGone(ctx, c.spoke, c.spokeAPI, claim, since, now, OrphanGrace)
}
