package hub

import (
	"context"
	"errors"
	"fmt"
	"sync"

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
type ManagedMachines struct {
	scope  Scope
	synced func() bool

	mu         sync.RWMutex
	byProvider map[string]*clusterv1.Machine
	byName     map[string]string // namespace/name -> providerID
}

// NewManagedMachines registers the index on the hub's Machine informer.
func (h *Hub) NewManagedMachines(ctx context.Context) (*ManagedMachines, error) {
	informer, err := h.GetCache().GetInformer(ctx, &clusterv1.Machine{}, cache.BlockUntilSynced(false))
	if err != nil {
		return nil, fmt.Errorf("getting the Machine informer: %w", err)
	}
	mm := &ManagedMachines{scope: h.Scope, byProvider: map[string]*clusterv1.Machine{}, byName: map[string]string{}}
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

func (mm *ManagedMachines) upsert(o any) {
	m, ok := o.(*clusterv1.Machine)
	if !ok {
		return
	}
	key := m.Namespace + "/" + m.Name
	mm.mu.Lock()
	defer mm.mu.Unlock()
	mm.forgetLocked(key)
	_, member := m.Labels[v1alpha1.KarpenterMemberLabel]
	if !member || m.Spec.ProviderID == "" || m.Annotations[v1alpha1.NodeClaimAnnotation] == "" || !mm.scope.Contains(m, m.Spec.ClusterName) {
		return
	}
	mm.byProvider[m.Spec.ProviderID] = m
	mm.byName[key] = m.Spec.ProviderID
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

// List calls f for every managed Machine.
func (mm *ManagedMachines) List(f func(*clusterv1.Machine)) error {
	if !mm.synced() {
		return ErrNotSynced
	}
	mm.mu.RLock()
	defer mm.mu.RUnlock()
	for _, m := range mm.byProvider {
		f(m)
	}
	return nil
}

// Len is the number of managed Machines.
func (mm *ManagedMachines) Len() int {
	mm.mu.RLock()
	defer mm.mu.RUnlock()
	return len(mm.byProvider)
}
