package hub

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// infraKey names an infrastructure machine.
type infraKey struct {
	group, kind, namespace, name string
}

func infraKeyOf(m *clusterv1.Machine) infraKey {
	ref := m.Spec.InfrastructureRef
	return infraKey{group: ref.APIGroup, kind: ref.Kind, namespace: m.Namespace, name: ref.Name}
}

// infraIDs follows spec.providerID of the infrastructure machines of the
// kinds managed Machines reference (any provider's kind, read as
// unstructured from the hub cache's informers). It is the contract field
// Cluster API copies to Machine.spec.providerID once the machine is
// provisioned; infrastructure providers set it as soon as the instance
// exists (CAPA right after RunInstances, instance pending).
type infraIDs struct {
	ctx     context.Context
	hub     *Hub
	changed func(infraKey, string) string // re-index; returns the NodeClaim to wake

	mu        sync.RWMutex
	ids       map[infraKey]string
	kinds     map[schema.GroupKind]func() bool // watched kinds -> synced
	listeners []func(claim string)
}

func newInfraIDs(ctx context.Context, h *Hub, changed func(infraKey, string) string) *infraIDs {
	return &infraIDs{ctx: ctx, hub: h, changed: changed, ids: map[infraKey]string{}, kinds: map[schema.GroupKind]func() bool{}}
}

func (x *infraIDs) addListener(f func(claim string)) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.listeners = append(x.listeners, f)
}

func (x *infraIDs) get(k infraKey) string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.ids[k]
}

// synced reports whether every watched kind has listed its objects: until
// then a Machine waiting for Cluster API's copy may lack its providerID.
func (x *infraIDs) synced() bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for _, ok := range x.kinds {
		if !ok() {
			return false
		}
	}
	return true
}

// watch starts following a kind, once. It runs from informer handlers, so
// the informer starts in the background; a kind the hub does not serve is
// left out (its Machines keep their providerID from Cluster API only).
func (x *infraIDs) watch(gk schema.GroupKind) {
	x.mu.Lock()
	if _, ok := x.kinds[gk]; ok {
		x.mu.Unlock()
		return
	}
	starting := make(chan struct{})
	var reg toolscache.ResourceEventHandlerRegistration
	x.kinds[gk] = func() bool {
		select {
		case <-starting:
			return reg == nil || reg.HasSynced()
		default:
			return false
		}
	}
	x.mu.Unlock()
	go func() {
		defer close(starting)
		reg = x.start(gk)
	}()
}

func (x *infraIDs) start(gk schema.GroupKind) toolscache.ResourceEventHandlerRegistration {
	logger := log.FromContext(x.ctx).WithName("infrastructure-providerids")
	mapping, err := x.hub.GetRESTMapper().RESTMapping(gk)
	if err != nil {
		logger.Error(err, "infrastructure machine kind is not served: its Machines get their providerID from Cluster API only", "kind", gk.String())
		return nil
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(mapping.GroupVersionKind)
	informer, err := x.hub.GetCache().GetInformer(x.ctx, u, cache.BlockUntilSynced(false))
	if err != nil {
		logger.Error(err, "watching infrastructure machines", "kind", gk.String())
		return nil
	}
	reg, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { x.set(o, false) },
		UpdateFunc: func(_, o any) { x.set(o, false) },
		DeleteFunc: func(o any) { x.set(o, true) },
	})
	if err != nil {
		logger.Error(err, "watching infrastructure machines", "kind", gk.String())
		return nil
	}
	return reg
}

func (x *infraIDs) set(o any, deleted bool) {
	if tomb, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o = tomb.Obj
	}
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return
	}
	gvk := u.GroupVersionKind()
	k := infraKey{group: gvk.Group, kind: gvk.Kind, namespace: u.GetNamespace(), name: u.GetName()}
	id, _, _ := unstructured.NestedString(u.Object, "spec", "providerID")
	if deleted {
		id = ""
	}
	x.mu.Lock()
	if x.ids[k] == id {
		x.mu.Unlock()
		return
	}
	if id == "" {
		delete(x.ids, k)
	} else {
		x.ids[k] = id
	}
	listeners := x.listeners
	x.mu.Unlock()
	if claim := x.changed(k, id); claim != "" {
		for _, f := range listeners {
			f(claim)
		}
	}
}
