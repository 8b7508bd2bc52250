package machine

import (
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// Reservations counts the slots of capacity reservations that Machine-mode
// Machines hold, so that a reserved offering tells Karpenter how many more
// instances it can take (Offering.ReservationCapacity).
//
// State, per reservation ID:
//   - held: the Machines in the hub annotated with the reservation, deleting
//     ones included (their instance holds the slot until it is terminated;
//     the Machine goes away only after that);
//   - pending: NodeClaims of this process that chose the reservation and
//     whose Machine the cache has not shown yet.
//
// Invariants: a NodeClaim is counted at most once (pending until its
// Machine is seen, then held); Reserve admits a launch only while
// held + pending < the reservation's count, under one lock, so concurrent
// launches of this process never exceed it. Slots come back when a Machine
// is deleted from the hub, or when a launch fails before its Machine exists.
type Reservations struct {
	mu      sync.Mutex
	held    map[string]map[types.NamespacedName]bool
	pending map[string]map[string]bool // reservation -> NodeClaims
	version atomic.Int64
	notify  func()
}

// NewReservations returns an empty count; notify is called when it changes.
func NewReservations(notify func()) *Reservations {
	return &Reservations{held: map[string]map[types.NamespacedName]bool{}, pending: map[string]map[string]bool{}, notify: notify}
}

// Version changes whenever a count changes.
func (r *Reservations) Version() int64 { return r.version.Load() }

func (r *Reservations) changed() {
	r.version.Add(1)
	if r.notify != nil {
		r.notify()
	}
}

// Used is how many slots of the reservation are taken.
func (r *Reservations) Used(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.held[id]) + len(r.pending[id])
}

// Reserve takes a slot of the reservation for a NodeClaim's launch, unless
// all count slots are taken. It is idempotent per NodeClaim.
func (r *Reservations) Reserve(id, claim string, count int) bool {
	r.mu.Lock()
	if r.pending[id][claim] {
		r.mu.Unlock()
		return true
	}
	if len(r.held[id])+len(r.pending[id]) >= count {
		r.mu.Unlock()
		return false
	}
	if r.pending[id] == nil {
		r.pending[id] = map[string]bool{}
	}
	r.pending[id][claim] = true
	r.mu.Unlock()
	r.changed()
	return true
}

// Unreserve gives back a slot a launch took and did not use.
func (r *Reservations) Unreserve(id, claim string) {
	r.mu.Lock()
	_, ok := r.pending[id][claim]
	delete(r.pending[id], claim)
	r.mu.Unlock()
	if ok {
		r.changed()
	}
}

// handler keeps held current from Machine events of the hub cache.
func (r *Reservations) handler() toolscache.ResourceEventHandlerFuncs {
	update := func(o any, gone bool) {
		if tomb, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
			o, gone = tomb.Obj, true
		}
		m, ok := o.(*clusterv1.Machine)
		if !ok {
			return
		}
		id := m.Annotations[v1alpha1.ReservationIDAnnotation]
		if id == "" {
			return
		}
		key := types.NamespacedName{Namespace: m.Namespace, Name: m.Name}
		r.mu.Lock()
		before := len(r.held[id]) + len(r.pending[id])
		if gone {
			delete(r.held[id], key)
		} else {
			if r.held[id] == nil {
				r.held[id] = map[types.NamespacedName]bool{}
			}
			r.held[id][key] = true
			delete(r.pending[id], m.Annotations[v1alpha1.NodeClaimAnnotation])
		}
		after := len(r.held[id]) + len(r.pending[id])
		r.mu.Unlock()
		if before != after {
			r.changed()
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { update(o, false) },
		UpdateFunc: func(_, o any) { update(o, false) },
		DeleteFunc: func(o any) { update(o, true) },
	}
}
