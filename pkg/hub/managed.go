package hub

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"

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
// A Machine's providerID is its own spec.providerID or, until Cluster API
// copies it there, its infrastructure machine's spec.providerID (see
// infra.go): Cluster API copies it only once the instance runs, while the
// infrastructure provider sets it as soon as the instance exists, pending.
// Launches return that early providerID (Karpenter waits for every launch
// before it plans the next pods), so Get and List must know the Machine by
// it from then on: core would otherwise take the instance for gone.
type ManagedMachines struct {
	scope  Scope
	synced func() bool
	infra  *infraIDs

	mu         sync.RWMutex
	byProvider map[string]*clusterv1.Machine
	byName     map[string]string // namespace/name -> providerID
	// Managed Machines without spec.providerID, by namespace/name, and the
	// namespace/name of each one's infrastructure machine.
	early   map[string]*clusterv1.Machine
	byInfra map[infraKey]string
}

// NewManagedMachines registers the index on the hub's Machine informer.
func (h *Hub) NewManagedMachines(ctx context.Context) (*ManagedMachines, error) {
	informer, err := h.GetCache().GetInformer(ctx, &clusterv1.Machine{}, cache.BlockUntilSynced(false))
	if err != nil {
		return nil, fmt.Errorf("getting the Machine informer: %w", err)
	}
	mm := &ManagedMachines{
		scope: h.Scope, byProvider: map[string]*clusterv1.Machine{}, byName: map[string]string{},
		early: map[string]*clusterv1.Machine{}, byInfra: map[infraKey]string{},
	}
	mm.infra = newInfraIDs(ctx, h, mm.infraChanged)
	reg, err := informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { mm.upsert(o) },
		UpdateFunc: func(_, o any) { mm.upsert(o) },
		DeleteFunc: func(o any) { mm.remove(o) },
	})
	if err != nil {
		return nil, fmt.Errorf("watching Machines: %w", err)
	}
	mm.synced = func() bool { return reg.HasSynced() && mm.infra.synced() }
	return mm, nil
}

// OnEarlyProviderID calls notify with the NodeClaim of a managed Machine
// whose infrastructure machine got (or changed) its providerID before the
// Machine has one: launches waiting for a providerID wake on it.
func (mm *ManagedMachines) OnEarlyProviderID(notify func(claim string)) {
	if mm == nil {
		return // no index (a model test's provider): Machine.spec.providerID only
	}
	mm.infra.addListener(notify)
}

func (mm *ManagedMachines) upsert(o any) {
	m, ok := o.(*clusterv1.Machine)
	if !ok {
		return
	}
	key := m.Namespace + "/" + m.Name
	var watch schema.GroupKind
	mm.mu.Lock()
	mm.forgetLocked(key)
	_, member := m.Labels[v1alpha1.KarpenterMemberLabel]
	if member && m.Annotations[v1alpha1.NodeClaimAnnotation] != "" && mm.scope.Contains(m, m.Spec.ClusterName) {
		id := m.Spec.ProviderID
		if id == "" {
			ik := infraKeyOf(m)
			mm.early[key], mm.byInfra[ik] = m, key
			id = mm.infra.get(ik)
			watch = schema.GroupKind{Group: m.Spec.InfrastructureRef.APIGroup, Kind: m.Spec.InfrastructureRef.Kind}
		}
		if id != "" {
			mm.byProvider[id] = m
			mm.byName[key] = id
		}
	}
	mm.mu.Unlock()
	if watch.Kind != "" {
		mm.infra.watch(watch)
	}
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
	mm.forgetLocked(m.Namespace + "/" + m.Name)
}

// forgetLocked drops the Machine <namespace>/<name>; mm.mu must be held.
func (mm *ManagedMachines) forgetLocked(key string) {
	if id, ok := mm.byName[key]; ok {
		delete(mm.byProvider, id)
		delete(mm.byName, key)
	}
	if m, ok := mm.early[key]; ok {
		delete(mm.early, key)
		if ik := infraKeyOf(m); mm.byInfra[ik] == key {
			delete(mm.byInfra, ik)
		}
	}
}

// infraChanged re-indexes the Machine of an infrastructure machine whose
// providerID changed, and returns its NodeClaim ("" if none waits on it).
func (mm *ManagedMachines) infraChanged(ik infraKey, id string) string {
	mm.mu.Lock()
	defer mm.mu.Unlock()
	key, ok := mm.byInfra[ik]
	if !ok {
		return ""
	}
	m := mm.early[key]
	if old, ok := mm.byName[key]; ok {
		delete(mm.byProvider, old)
		delete(mm.byName, key)
	}
	if id != "" {
		mm.byProvider[id] = m
		mm.byName[key] = id
	}
	return m.Annotations[v1alpha1.NodeClaimAnnotation]
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

// ProviderIDOf returns a managed Machine's providerID: its own, or its
// infrastructure machine's before Cluster API copied it ("" if neither).
func (mm *ManagedMachines) ProviderIDOf(m *clusterv1.Machine) string {
	if m.Spec.ProviderID != "" || mm == nil {
		return m.Spec.ProviderID
	}
	mm.mu.RLock()
	defer mm.mu.RUnlock()
	return mm.byName[m.Namespace+"/"+m.Name]
}

// List calls f for every managed Machine with its providerID.
func (mm *ManagedMachines) List(f func(providerID string, m *clusterv1.Machine)) error {
	if !mm.synced() {
		return ErrNotSynced
	}
	mm.mu.RLock()
	defer mm.mu.RUnlock()
	for id, m := range mm.byProvider {
		f(id, m)
	}
	return nil
}

// Len is the number of managed Machines.
func (mm *ManagedMachines) Len() int {
	mm.mu.RLock()
	defer mm.mu.RUnlock()
	return len(mm.byProvider)
}
