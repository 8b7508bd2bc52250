package launch

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
)

// InfraWatch makes events of infrastructure machines (any kind, read as
// unstructured from the hub cache, the informer ReadFailure reads) wake the
// launch waiting for them, so that a failed launch is seen as soon as the
// infrastructure provider reports it, not when Cluster API next mirrors it
// onto the Machine.
type InfraWatch struct {
	hub *hub.Hub
	// claimOf names the NodeClaim whose launch an infrastructure machine
	// serves, or "".
	claimOf func(context.Context, client.Object) string
	notify  func(claim string)
	watched sync.Map // schema.GroupVersionKind -> true
}

// NewInfraWatch returns a watch that tells notify of the NodeClaim claimOf
// finds for each infrastructure machine event.
func NewInfraWatch(h *hub.Hub, claimOf func(context.Context, client.Object) string, notify func(claim string)) *InfraWatch {
	return &InfraWatch{hub: h, claimOf: claimOf, notify: notify}
}

// Ensure watches the kind, once.
func (w *InfraWatch) Ensure(ctx context.Context, gvk schema.GroupVersionKind) error {
	if _, ok := w.watched.Load(gvk); ok {
		return nil
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	informer, err := w.hub.GetCache().GetInformer(ctx, u, cache.BlockUntilSynced(true))
	if err != nil {
		return fmt.Errorf("watching %s: %w", gvk.Kind, err)
	}
	if _, loaded := w.watched.LoadOrStore(gvk, true); loaded {
		return nil
	}
	wake := func(o any) {
		if tomb, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
			o = tomb.Obj
		}
		if obj, ok := o.(client.Object); ok {
			if claim := w.claimOf(context.Background(), obj); claim != "" {
				w.notify(claim)
			}
		}
	}
	if _, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: wake, UpdateFunc: func(_, o any) { wake(o) }, DeleteFunc: wake}); err != nil {
		w.watched.Delete(gvk)
		return fmt.Errorf("watching %s: %w", gvk.Kind, err)
	}
	return nil
}

// EnsureFor watches the kind of the given infrastructure reference (group
// and kind, at the version the hub serves).
func (w *InfraWatch) EnsureFor(ctx context.Context, group, kind string) error {
	mapping, err := w.hub.GetRESTMapper().RESTMapping(schema.GroupKind{Group: group, Kind: kind})
	if err != nil {
		return fmt.Errorf("kind %s.%s is not served by the management cluster: %w", kind, group, err)
	}
	return w.Ensure(ctx, mapping.GroupVersionKind)
}
