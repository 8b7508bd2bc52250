package hub

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// ErrNotSynced is returned while the hub cache has not listed Machines yet:
// an empty answer then would read as "every Machine is gone".
var ErrNotSynced = errors.New("management cluster cache has not synced yet")

// ManagedMachines indexes the Karpenter-managed Machines in scope (member
// label, bound to a NodeClaim, with a providerID) by providerID, fed by the
// Machine informer. Get and List read it without listing or copying: the
// Machines are the informer's own objects and must not be modified.
//
// A Machine's providerID is its spec.providerID or, until Cluster API copies
// it there (only once the infrastructure machine is provisioned, i.e. after
// the instance booted), its infrastructure machine's spec.providerID (CAPA
// sets it right after RunInstances). A launch returns as soon as the
// infrastructure has one (see launch.ProviderIDOf), so the NodeClaim carries
// it before the Machine does: the index must know the Machine by it from
// then on, or Karpenter's garbage collection and termination would take the
// booting instance for gone.
type ManagedMachines struct {
	hub    *Hub
	ctx    context.Context
	scope  Scope
	synced func() bool

	mu         sync.RWMutex
	byProvider map[string]*clusterv1.Machine
	byName     map[string]string // namespace/name -> providerID
	// Machines that qualify but have no spec.providerID yet, by their
	// infrastructure machine's key, and that key's providerID when its
	// informer has shown one.
	waiting  map[string]*clusterv1.Machine // infra key -> Machine
	infraIDs map[string]string             // infra key -> spec.providerID
	watched  map[schema.GroupKind]bool     // infrastructure kinds watched (or being)
}

// NewManagedMachines registers the index on the hub's Machine informer.
func (h *Hub) NewManagedMachines(ctx context.Context) (*ManagedMachines, error) {
	informer, err := h.GetCache().GetInformer(ctx, &clusterv1.Machine{}, cache.BlockUntilSynced(false))
	if err != nil {
		return nil, fmt.Errorf("getting the Machine informer: %w", err)
	}
	mm := &ManagedMachines{
		hub: h, ctx: ctx, scope: h.Scope,
		byProvider: map[string]*clusterv1.Machine{}, byName: map[string]string{},
		waiting: map[string]*clusterv1.Machine{}, infraIDs: map[string]string{}, watched: map[schema.GroupKind]bool{},
	}
	reg, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { mm.upsert(o) },
		UpdateFunc: func(_, o any) { mm.upsert(o) },
		DeleteFunc: func(o any) { mm.remove(o) },
	})
	if err != nil {
		return nil, fmt.Errorf("watching Machines: %w", err)
	}
	mm.synced = reg.HasSynced
	return mm, nil
}

// infraKey names a Machine's infrastructure machine.
func infraKey(m *clusterv1.Machine) string {
	ref := m.Spec.InfrastructureRef
	if ref.Name == "" {
		return ""
	}
	return ref.APIGroup + "/" + ref.Kind + "/" + m.Namespace + "/" + ref.Name
}

func (mm *ManagedMachines) upsert(o any) {
	m, ok := o.(*clusterv1.Machine)
	if !ok {
		return
	}
	key := m.Namespace + "/" + m.Name
	mm.mu.Lock()
	defer mm.mu.Unlock()
	mm.forgetLocked(key, m)
	_, member := m.Labels[v1alpha1.KarpenterMemberLabel]
	if !member || m.Annotations[v1alpha1.NodeClaimAnnotation] == "" || !mm.scope.Contains(m, m.Spec.ClusterName) {
		return
	}
	id := m.Spec.ProviderID
	if id == "" {
		ik := infraKey(m)
		if ik == "" {
			return
		}
		mm.waiting[ik] = m
		mm.watchLocked(schema.GroupKind{Group: m.Spec.InfrastructureRef.APIGroup, Kind: m.Spec.InfrastructureRef.Kind})
		if id = mm.infraIDs[ik]; id == "" {
			return
		}
	}
	mm.byProvider[id] = m
	mm.byName[key] = id
}

func (mm *ManagedMachines) remove(o any) {
	if tomb, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o = tomb.Obj
	}
	m, ok := o.(*clusterv1.Machine)
	if !ok {
		return
	}
	mm.mu.Lock()
	defer mm.mu.Unlock()
	mm.forgetLocked(m.Namespace+"/"+m.Name, m)
}

// forgetLocked drops the Machine <namespace>/<name>; mm.mu must be held.
func (mm *ManagedMachines) forgetLocked(key string, m *clusterv1.Machine) {
	if id, ok := mm.byName[key]; ok {
		if mm.byProvider[id] != nil && mm.byProvider[id].Namespace+"/"+mm.byProvider[id].Name == key {
			delete(mm.byProvider, id)
		}
		delete(mm.byName, key)
	}
	if ik := infraKey(m); ik != "" {
		if w := mm.waiting[ik]; w != nil && w.Namespace+"/"+w.Name == key {
			delete(mm.waiting, ik)
		}
	}
}

// watchLocked starts, once per kind and in the background (an informer
// event handler must not block), watching the infrastructure machines of
// the kind for their providerID; mm.mu must be held.
func (mm *ManagedMachines) watchLocked(gk schema.GroupKind) {
	if mm.watched[gk] || mm.hub == nil {
		return
	}
	mm.watched[gk] = true
	go func() {
		if err := mm.watchInfra(gk); err != nil {
			log.FromContext(mm.ctx).Error(err, "Machines are known by their providerID only once Cluster API copies it", "kind", gk.String())
			mm.mu.Lock()
			delete(mm.watched, gk) // the next waiting Machine tries again
			mm.mu.Unlock()
		}
	}()
}

func (mm *ManagedMachines) watchInfra(gk schema.GroupKind) error {
	mapping, err := mm.hub.GetRESTMapper().RESTMapping(gk)
	if err != nil {
		return fmt.Errorf("kind %s is not served by the management cluster: %w", gk, err)
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(mapping.GroupVersionKind)
	informer, err := mm.hub.GetCache().GetInformer(mm.ctx, u, cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("watching %s: %w", gk, err)
	}
	observe := func(o any, gone bool) {
		if tomb, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
			o, gone = tomb.Obj, true
		}
		if u, ok := o.(*unstructured.Unstructured); ok {
			id, _, _ := unstructured.NestedString(u.Object, "spec", "providerID")
			mm.observeInfra(gk.Group+"/"+gk.Kind+"/"+u.GetNamespace()+"/"+u.GetName(), id, gone)
		}
	}
	if _, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { observe(o, false) },
		UpdateFunc: func(_, o any) { observe(o, false) },
		DeleteFunc: func(o any) { observe(o, true) },
	}); err != nil {
		return fmt.Errorf("watching %s: %w", gk, err)
	}
	return nil
}

// observeInfra records an infrastructure machine's providerID and indexes
// the waiting Machine it belongs to by it.
func (mm *ManagedMachines) observeInfra(ik, id string, gone bool) {
	mm.mu.Lock()
	defer mm.mu.Unlock()
	if gone || id == "" {
		// A waiting Machine known by the gone instance's ID is known no more.
		if m := mm.waiting[ik]; m != nil {
			key := m.Namespace + "/" + m.Name
			if old, ok := mm.byName[key]; ok && old == mm.infraIDs[ik] {
				delete(mm.byProvider, old)
				delete(mm.byName, key)
			}
		}
		delete(mm.infraIDs, ik)
		return
	}
	mm.infraIDs[ik] = id
	if m := mm.waiting[ik]; m != nil {
		key := m.Namespace + "/" + m.Name
		if old, ok := mm.byName[key]; ok && old != id {
			delete(mm.byProvider, old)
		}
		mm.byProvider[id] = m
		mm.byName[key] = id
	}
}

// Get returns the managed Machine with this providerID, or nil.
func (mm *ManagedMachines) Get(providerID string) (*clusterv1.Machine, error) {
	if !mm.synced() {
		return nil, ErrNotSynced
	}
	mm.mu.RLock()
	defer mm.mu.RUnlock()
	return mm.byProvider[providerID], nil
}

// List calls f for every managed Machine and its providerID (the Machine's,
// or its infrastructure machine's until Cluster API copies it).
func (mm *ManagedMachines) List(f func(m *clusterv1.Machine, providerID string)) error {
	if !mm.synced() {
		return ErrNotSynced
	}
	mm.mu.RLock()
	defer mm.mu.RUnlock()
	for id, m := range mm.byProvider {
		f(m, id)
	}
	return nil
}

// Len is the number of managed Machines.
func (mm *ManagedMachines) Len() int {
	mm.mu.RLock()
	defer mm.mu.RUnlock()
	return len(mm.byProvider)
}
