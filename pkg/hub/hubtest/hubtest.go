// Package hubtest is a management cluster for unit and model tests: an
// in-memory API server (controller-runtime's fake client, with the hub's
// field indexes) behind a cache that lags until told to catch up, as an
// informer does.
package hubtest

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/meta/testrestmapper"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
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
	// API is the API server's truth.
	API client.WithWatch

	mu       sync.Mutex
	lag      bool
	snapshot client.Client
	funcs    interceptor.Funcs
}

// New returns a fake hub holding objs, in scope.
func New(scope hub.Scope, funcs interceptor.Funcs, objs ...client.Object) *Hub {
	api := builder().WithObjects(objs...).WithInterceptorFuncs(funcs).Build()
	f := &Hub{API: api, funcs: funcs}
	f.snapshot = builder().Build()
	f.Sync()
	f.Hub = &hub.Hub{Cluster: &fakeCluster{hub: f}, Scope: scope}
	return f
}

// mapper maps every kind of the scheme, as a hub serving Cluster API and
// CAPA does (the fake client's default maps none: infrastructure machines
// could not be read by kind).
var mapper = testrestmapper.TestOnlyStaticRESTMapper(scheme.Scheme)

func builder() *fake.ClientBuilder {
	b := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithRESTMapper(mapper)
	for _, i := range hub.Indexes() {
		b = b.WithIndex(i.Object, i.Field, i.Extract)
	}
	return b
}

// lists are the kinds a cache snapshot holds.
func lists() []client.ObjectList {
	return []client.ObjectList{&clusterv1.MachineList{}, &clusterv1.MachineDeploymentList{}, &clusterv1.MachineSetList{},
		&clusterv1.ClusterList{}, &infrav1.AWSMachineList{}, &infrav1.AWSMachineTemplateList{}}
}

// SetLag makes cache reads see the last Sync (true) or the API server (false).
func (f *Hub) SetLag(lag bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lag = lag
}

// Sync makes the cache catch up with the API server.
func (f *Hub) Sync() {
	var objs []client.Object
	for _, l := range lists() {
		if err := f.API.List(context.Background(), l); err != nil {
			panic(fmt.Sprintf("listing %T: %v", l, err))
		}
		items, _ := meta.ExtractList(l)
		for _, it := range items {
			objs = append(objs, it.(client.Object))
		}
	}
	snap := builder().WithObjects(objs...).Build()
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
	return f.API
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
	return c.hub.API.RESTMapper()
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

func (c *laggingCache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return c.hub.reader().List(ctx, list, opts...)
}
