package machine

import (
	"context"
	"fmt"
	"time"

	"github.com/awslabs/operatorpkg/reconciler"
	"github.com/awslabs/operatorpkg/singleton"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	controllerruntime "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
	"github.com/autonode/karpenter-clusterapi/pkg/spoke"
)

// Grace periods of the garbage collector.
const (
	// OrphanGrace is how long a Machine's NodeClaim must be gone before the
	// Machine is deleted: longer than the spoke cache's lag.
	OrphanGrace = 30 * time.Second
	// LeftoverGrace is how long an infrastructure machine or bootstrap
	// config may exist without its Machine before it is taken as the
	// leftover of an interrupted launch.
	LeftoverGrace = 2 * time.Minute
	gcInterval    = 15 * time.Second
)

// GarbageCollector removes what Machine mode created and nothing owns any
// more: Machines whose NodeClaim is gone, and infrastructure machines and
// bootstrap configs of launches interrupted before their Machine existed.
// It never touches an object without the provider's labels.
type GarbageCollector struct {
	provider *Provider
	spoke    client.Reader // cached
	spokeAPI client.Reader // live
	events   record.EventRecorder
	now      func() time.Time
}

// NewGarbageCollector returns the collector.
func NewGarbageCollector(p *Provider, spoke, spokeAPI client.Reader) *GarbageCollector {
	return &GarbageCollector{provider: p, spoke: spoke, spokeAPI: spokeAPI, events: p.Events, now: time.Now}
}

// Name of the controller.
func (g *GarbageCollector) Name() string { return "machine.garbagecollection" }

// Register runs the collector periodically.
func (g *GarbageCollector) Register(_ context.Context, m manager.Manager) error {
	return controllerruntime.NewControllerManagedBy(m).
		Named(g.Name()).
		WatchesRawSource(singleton.Source()).
		Complete(singleton.AsReconciler(g))
}

// Reconcile makes one pass.
func (g *GarbageCollector) Reconcile(ctx context.Context) (reconciler.Result, error) {
	if err := g.machines(ctx); err != nil {
		after, err := hub.OutageResult(err)
		return reconciler.Result{RequeueAfter: after}, err
	}
	if err := g.leftovers(ctx); err != nil {
		after, err := hub.OutageResult(err)
		return reconciler.Result{RequeueAfter: after}, err
	}
	return reconciler.Result{RequeueAfter: gcInterval}, nil
}

// machines deletes standalone member Machines whose NodeClaim is gone.
func (g *GarbageCollector) machines(ctx context.Context) error {
	h := g.provider.hub
	list := &clusterv1.MachineList{}
	sel := labels.SelectorFromSet(nil)
	if err := h.GetCache().List(ctx, list, h.Scope.ListOptions(hub.HasLabel(sel, v1alpha1.KarpenterMemberLabel))...); err != nil {
		return fmt.Errorf("listing Machines: %w", err)
	}
	now := g.now()
	for i := range list.Items {
		m := &list.Items[i]
		claim := m.Annotations[v1alpha1.NodeClaimAnnotation]
		if claim == "" || m.Labels[clusterv1.MachineDeploymentNameLabel] != "" || m.Annotations[v1alpha1.OfferingAnnotation] == "" ||
			!m.DeletionTimestamp.IsZero() || g.provider.Launching(claim) || !g.provider.machines.Owned(m) {
			continue
		}
		gone, err := spoke.NodeClaimGone(ctx, g.spoke, g.spokeAPI, claim, m.CreationTimestamp.Time, now, OrphanGrace)
		if err != nil {
			return err
		}
		if !gone {
			continue
		}
		if err := g.provider.deleteMachine(ctx, m); err != nil {
			if err == ErrMachineGone {
				continue
			}
			return err
		}
		metrics.OrphansReleased.WithLabelValues("machine").Inc()
		log.FromContext(ctx).Info("deleted Machine of a deleted NodeClaim", "machine", client.ObjectKeyFromObject(m), "nodeclaim", claim)
		if g.events != nil {
			g.events.Event(m, corev1.EventTypeNormal, "OrphanDeleted", "NodeClaim "+claim+" is gone: Machine deleted")
		}
	}
	return nil
}

// leftovers deletes infrastructure machines and bootstrap configs the
// provider made for a launch whose Machine never came to exist.
func (g *GarbageCollector) leftovers(ctx context.Context) error {
	ncs := &v1alpha1.ClusterAPINodeClassList{}
	if err := g.spoke.List(ctx, ncs); err != nil {
		return fmt.Errorf("listing ClusterAPINodeClasses: %w", err)
	}
	kinds := map[schema.GroupKind]bool{}
	for i := range ncs.Items {
		mt := ncs.Items[i].Spec.MachineTemplate
		if mt == nil {
			continue
		}
		kinds[schema.GroupKind{Group: mt.InfrastructureTemplates.APIGroup, Kind: machineKind(mt.InfrastructureTemplates.Kind)}] = true
		if ref := mt.Bootstrap.ConfigRef; ref != nil {
			kinds[schema.GroupKind{Group: ref.APIGroup, Kind: machineKind(ref.Kind)}] = true
		}
	}
	for gk := range kinds {
		if err := g.leftoversOf(ctx, gk); err != nil {
			return err
		}
	}
	return nil
}

func (g *GarbageCollector) leftoversOf(ctx context.Context, gk schema.GroupKind) error {
	h := g.provider.hub
	gvk, err := ResolveKind(h, gk.Group, gk.Kind)
	if err != nil {
		return nil // not served (yet): the NodeClass says so in its status
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	sel := labels.SelectorFromSet(labels.Set{v1alpha1.ManagedLabel: "true"})
	opts := append(h.Scope.NamespaceListOptions(), client.MatchingLabelsSelector{Selector: sel})
	if err := h.GetCache().List(ctx, list, opts...); err != nil {
		return fmt.Errorf("listing %s: %w", gvk.Kind, err)
	}
	now := g.now()
	for i := range list.Items {
		u := &list.Items[i]
		claim := u.GetAnnotations()[v1alpha1.NodeClaimAnnotation]
		if claim == "" || u.GetDeletionTimestamp() != nil || g.provider.Launching(claim) || g.ownerLives(ctx, u) {
			continue
		}
		if h.Scope.ClusterName != "" && u.GetLabels()[clusterv1.ClusterNameLabel] != h.Scope.ClusterName {
			continue
		}
		if now.Sub(u.GetCreationTimestamp().Time) < LeftoverGrace {
			continue
		}
		// Its Machine (same name) may exist and not have claimed it yet.
		m := &clusterv1.Machine{}
		err := h.GetAPIReader().Get(ctx, types.NamespacedName{Namespace: u.GetNamespace(), Name: u.GetName()}, m)
		if err == nil {
			continue
		}
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("reading Machine %s/%s: %w", u.GetNamespace(), u.GetName(), err)
		}
		if err := h.GetClient().Delete(ctx, u, client.Preconditions{UID: ptrUID(u)}); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
			metrics.HubErrors.WithLabelValues("delete_" + gvk.Kind).Inc()
			return fmt.Errorf("deleting %s %s/%s: %w", gvk.Kind, u.GetNamespace(), u.GetName(), err)
		}
		metrics.OrphansReleased.WithLabelValues("leftover").Inc()
		log.FromContext(ctx).Info("deleted the leftover of an interrupted launch", "kind", gvk.Kind, "name", client.ObjectKeyFromObject(u), "nodeclaim", claim)
	}
	return nil
}

// ownerLives reports whether the part's owner Machine is in the hub cache.
// Launches create parts owned by their Machine (parts.go): one whose
// Machine went before the part was made (its NodeClaim deleted meanwhile)
// is a leftover too, confirmed below by a live read.
func (g *GarbageCollector) ownerLives(ctx context.Context, u *unstructured.Unstructured) bool {
	ref := machineOwner(u)
	if ref == nil {
		return false
	}
	m := &clusterv1.Machine{}
	if err := g.provider.hub.GetCache().Get(ctx, types.NamespacedName{Namespace: u.GetNamespace(), Name: ref.Name}, m); err != nil {
		return false
	}
	return m.UID == ref.UID
}

func ptrUID(u *unstructured.Unstructured) *types.UID {
	uid := u.GetUID()
	return &uid
}
