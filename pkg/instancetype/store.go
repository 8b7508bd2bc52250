package instancetype

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/autonode/karpenter-clusterapi/pkg/kubelet"
)

// Store holds the Source of every origin in scope, kept current by a
// controller watching the hub, and memoizes the Set each selector resolves
// to until a source changes. GetInstanceTypes is called on every scheduling
// pass; with the memo it costs a map lookup, not a rebuild.
type Store struct {
	primeMu sync.Mutex
	primed  bool
	primer  func(context.Context) error

	mu         sync.RWMutex
	sources    map[types.NamespacedName]Source
	generation uint64
	memo       map[string]memoEntry

	subMu     sync.Mutex
	listeners []chan struct{}

	// zones are the infrastructure's known zones (UseZones).
	zones *Zones
}

// UseZones makes every Set built from now on carry price records in these
// zones (see Zones), and rebuilds on each new zone.
func (s *Store) UseZones(z *Zones) {
	s.mu.Lock()
	s.zones = z
	s.changed()
	s.mu.Unlock()
	z.OnChange(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.changed()
	})
}

type memoEntry struct {
	generation uint64
	set        *Set
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{sources: map[types.NamespacedName]Source{}, memo: map[string]memoEntry{}}
}

// SetPrimer sets the function that fills the store from the hub's current
// state; Prime runs it until it has succeeded once.
func (s *Store) SetPrimer(f func(context.Context) error) {
	s.primeMu.Lock()
	defer s.primeMu.Unlock()
	s.primer = f
}

// Prime makes sure the store holds every origin in scope before it is
// trusted: right after a start, an empty store would read as "nothing
// matches", turning NodeClasses not Ready and launches into insufficient
// capacity. It fails (retryably) while the hub cannot be read.
func (s *Store) Prime(ctx context.Context) error {
	s.primeMu.Lock()
	defer s.primeMu.Unlock()
	if s.primed || s.primer == nil {
		return nil
	}
	if err := s.primer(ctx); err != nil {
		return fmt.Errorf("reading the management cluster's MachineDeployments: %w", err)
	}
	s.primed = true
	return nil
}

// Subscribe returns a channel that signals (coalesced: one pending signal
// covers every change before it is read) each change after the call. Every
// listener gets its own channel, so none takes a signal from another.
func (s *Store) Subscribe() <-chan struct{} {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	ch := make(chan struct{}, 1)
	s.listeners = append(s.listeners, ch)
	return ch
}

// Notify signals every listener without changing any source: Machine mode's
// templates live elsewhere but wake the same listeners.
func (s *Store) Notify() {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	for _, ch := range s.listeners {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (s *Store) changed() {
	s.generation++
	s.Notify()
}

// Put records the source of an origin.
func (s *Store) Put(src Source) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.sources[src.Origin]; ok && sameSource(old, src) {
		return // a resync or an unrelated event: keep the memo
	}
	s.sources[src.Origin] = src
	s.changed()
}

// sameSource compares two sources; errors compare by message (reflection
// cannot look into an error's unexported fields).
func sameSource(a, b Source) bool {
	if (a.Err == nil) != (b.Err == nil) || (a.Err != nil && a.Err.Error() != b.Err.Error()) {
		return false
	}
	a.Err, b.Err = nil, nil
	return equality.Semantic.DeepEqual(a, b)
}

// Delete forgets an origin.
func (s *Store) Delete(origin types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.sources[origin]; ok {
		delete(s.sources, origin)
		s.changed()
	}
}

// Get returns the source of an origin.
func (s *Store) Get(origin types.NamespacedName) (Source, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	src, ok := s.sources[origin]
	return src, ok
}

// Resolve returns the Set of the sources whose object labels match the
// selector. memoKey must identify the selector (e.g. its String()).
// The returned Set is shared: callers must not modify it.
func (s *Store) Resolve(selector labels.Selector, memoKey string) *Set {
	return s.ResolveKubelet(selector, kubelet.Config{}, memoKey)
}

// ResolveKubelet is Resolve with a NodeClass's kubelet settings (spec.kubelet)
// layered over every source's own (Source.WithKubelet). The memo key is
// memoKey plus the settings' Key, so NodeClasses that select the same
// objects with different settings get their own Sets.
func (s *Store) ResolveKubelet(selector labels.Selector, override kubelet.Config, memoKey string) *Set {
	if k := override.Key(); k != "" {
		memoKey += "|kubelet:" + k
	}
	s.mu.RLock()
	if e, ok := s.memo[memoKey]; ok && e.generation == s.generation {
		s.mu.RUnlock()
		return e.set
	}
	gen := s.generation
	zones := s.zones.List()
	var matched []Source
	for _, src := range s.sources {
		if selector.Matches(labels.Set(src.ObjectLabels)) {
			matched = append(matched, src.WithKubelet(override))
		}
	}
	s.mu.RUnlock()

	set := Build(matched, zones...)
	s.mu.Lock()
	if s.generation == gen {
		s.memo[memoKey] = memoEntry{generation: gen, set: set}
	}
	s.mu.Unlock()
	return set
}
