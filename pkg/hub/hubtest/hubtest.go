// Package hubtest is a management cluster for unit and model tests: an
// in-memory API server (Store, with the hub's field indexes) behind a cache
// that lags until told to catch up, as an informer does.
package hubtest

import (
	"context"
	"errors"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/meta/testrestmapper"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/cluster"

	_ "github.com/autonode/karpenter-clusterapi/pkg/apis" // registers the types in client-go's scheme
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
)

// Hub is a fake management cluster. Writes go to the API server at once;
// cache reads see what the API server held at the last Sync (or the API
// server itself while Lag is false).
type Hub struct {
	*hub.Hub
	// API is the API server's truth (writes pass the interceptor funcs).
	API client.WithWatch

	store    *Store
	mu       sync.Mutex
	lag      bool
	snapshot *Store
}

// mapper maps every kind of the scheme, as a hub serving Cluster API and
// CAPA does (infrastructure machines are read by kind).
var mapper = testrestmapper.TestOnlyStaticRESTMapper(scheme.Scheme)

// NewIndexedStore returns an empty Store with the hub cache's field indexes.
func NewIndexedStore() *Store {
	s := NewStore(scheme.Scheme, mapper)
	for _, i := range hub.Indexes() {
		s.Index(i.Object, i.Field, i.Extract)
	}
	return s
}

// New returns a fake hub holding objs, in scope; funcs intercept the API
// server's calls (a test's invariant checks).
func New(scope hub.Scope, funcs interceptor.Funcs, objs ...client.Object) *Hub {
	s := NewIndexedStore()
	for _, o := range objs {
		if err := s.Create(context.Background(), o); err != nil {
			panic(err)
		}
	}
	f := &Hub{API: interceptor.NewClient(s, funcs), store: s}
	f.Sync()
	f.Hub = &hub.Hub{Cluster: &fakeCluster{hub: f}, Scope: scope}
	return f
}

// SetClock sets the API server's clock (creation, deletion and
// managed-fields times).
func (f *Hub) SetClock(now func() time.Time) { f.store.SetClock(now) }

// SetLag makes cache reads see the last Sync (true) or the API server
// (false). Turning lag on starts from what reads saw last (the API server),
// as an informer's cache never goes back in time: it only stops following.
func (f *Hub) SetLag(lag bool) {
	f.mu.Lock()
	was := f.lag
	f.mu.Unlock()
	if lag && !was {
		f.Sync()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lag = lag
}

// Sync makes the cache catch up with the API server.
func (f *Hub) Sync() {
	snap := f.store.Snapshot()
	f.mu.Lock()
	f.snapshot = snap
	f.mu.Unlock()
}

func (f *Hub) reader() client.Reader {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lag {
		return f.snapshot
	}
	return f.store
}

// fakeCluster is the cluster.Cluster the provider's code reads through;
// methods the provider does not call panic (nil embedded interface).
type fakeCluster struct {
	cluster.Cluster
	hub *Hub
}

func (c *fakeCluster) GetClient() client.Client    { return c.hub.API }
func (c *fakeCluster) GetAPIReader() client.Reader { return c.hub.API }
func (c *fakeCluster) GetCache() cache.Cache       { return &laggingCache{hub: c.hub} }
func (c *fakeCluster) GetScheme() *runtime.Scheme  { return scheme.Scheme }
func (c *fakeCluster) GetRESTMapper() meta.RESTMapper {
	return mapper
}
func (c *fakeCluster) GetEventRecorderFor(string) record.EventRecorder { return nil }

// laggingCache reads the snapshot (or the API server while not lagging).
type laggingCache struct {
	cache.Cache
	hub *Hub
}

func (c *laggingCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return c.hub.reader().Get(ctx, key, obj, opts...)
}

// GetInformer: the simulated cache has no informers; callers that watch
// for speed (a launch's infrastructure watch) go on without one.
func (c *laggingCache) GetInformer(context.Context, client.Object, ...cache.InformerGetOption) (cache.Informer, error) {
	return nil, errNoInformers
}

var errNoInformers = errors.New("hubtest: the simulated cache has no informers")

func (c *laggingCache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return c.hub.reader().List(ctx, list, opts...)
}
