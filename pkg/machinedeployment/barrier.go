package machinedeployment

import (
	"reflect"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// barrier remembers each object this process wrote, as the write returned
// it, until the cache shows that resourceVersion or a later one. A decision
// that writes is taken only on a view that shows this process's own
// writes: the cache, with each object this process wrote since the cache's
// copy in place of that copy (latest). That is the one in-memory cache the
// binding protocol keeps (design doc, "Memory"). An entry older than
// barrierTTL is forgotten (the object went, or the informer relisted past
// it): a leak guard, far above any cache lag the design tolerates; a
// restarted process has none either.
type barrier struct {
	mu      sync.Mutex
	pending map[barrierKey]barrierEntry
	// binds maps a NodeClaim to the Machine this process bound it to,
	// while the cache may not show that write.
	binds map[string]types.NamespacedName
	now   func() time.Time
}

type barrierKey struct {
	kind string
	key  types.NamespacedName
}

type barrierEntry struct {
	rv int64
	at time.Time
	// obj is the object as the write returned it.
	obj client.Object
}

const barrierTTL = 5 * time.Minute

func (b *barrier) record(kind string, obj client.Object) {
	rv, err := strconv.ParseInt(obj.GetResourceVersion(), 10, 64)
	if err != nil {
		return // not comparable: nothing to wait for
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pending == nil {
		b.pending = map[barrierKey]barrierEntry{}
	}
	copied, _ := obj.DeepCopyObject().(client.Object)
	b.pending[barrierKey{kind, client.ObjectKeyFromObject(obj)}] = barrierEntry{rv: rv, at: b.now(), obj: copied}
}

// recordBind records a binding this process made.
func (b *barrier) recordBind(claim string, m client.Object) {
	b.record("Machine", m)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.binds == nil {
		b.binds = map[string]types.NamespacedName{}
	}
	b.binds[claim] = client.ObjectKeyFromObject(m)
}

// boundTo returns the Machine this process bound the NodeClaim to while the
// cache may not show it yet.
func (b *barrier) boundTo(claim string) (types.NamespacedName, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	key, ok := b.binds[claim]
	if !ok {
		return key, false
	}
	if e, waiting := b.pending[barrierKey{"Machine", key}]; !waiting || b.now().Sub(e.at) > barrierTTL {
		delete(b.binds, claim)
		return key, false
	}
	return key, true
}

// shows reports whether a cached object (nil: not in the cache, gone)
// shows this process's last write of it.
func (b *barrier) shows(kind string, key types.NamespacedName, cached client.Object) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.newer(barrierKey{kind, key}, cached)
	return !ok
}

// latest returns the object to decide on: the cached one (nil: not in the
// cache, gone) when it shows this process's last write of it, else a copy
// of the object that write returned, which is what a cache that had caught
// up with the write would hold at the least. A decision then never waits
// for the informer to deliver the process's own writes (on a loaded
// management cluster that took seconds per binding, and a burst's bindings
// came one per wait).
func latest[T client.Object](b *barrier, kind string, key types.NamespacedName, cached T) T {
	b.mu.Lock()
	defer b.mu.Unlock()
	written, ok := b.newer(barrierKey{kind, key}, cached)
	if !ok || written == nil {
		return cached
	}
	out, ok := written.DeepCopyObject().(T)
	if !ok {
		return cached
	}
	return out
}

// newer reports whether the cached object does not show this process's
// last write of it, and returns what that write returned; the caller holds
// the lock.
func (b *barrier) newer(k barrierKey, cached client.Object) (client.Object, bool) {
	e, ok := b.pending[k]
	if !ok {
		return nil, false
	}
	if b.now().Sub(e.at) > barrierTTL {
		delete(b.pending, k)
		return nil, false
	}
	if cached == nil || reflect.ValueOf(cached).IsNil() {
		// This mode only changes objects that exist: one the cache no
		// longer has is gone, and nothing of it is waited for.
		delete(b.pending, k)
		return nil, false
	}
	rv, err := strconv.ParseInt(cached.GetResourceVersion(), 10, 64)
	if err != nil || rv >= e.rv {
		delete(b.pending, k)
		return nil, false
	}
	return e.obj, true
}

// waiting lists the keys of one kind in a namespace still waited for.
func (b *barrier) waiting(kind, namespace string) []types.NamespacedName {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []types.NamespacedName
	for k := range b.pending {
		if k.kind == kind && k.key.Namespace == namespace {
			out = append(out, k.key)
		}
	}
	return out
}
