package hub

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// FieldManager is the field manager of every write the provider makes to
// the management cluster (its user agent's product name, from which the API
// server names the manager of updates and patches). The coexistence report
// (pkg/controllers/coexistence) tells the provider's own replica changes
// from other writers' by it, so it must not change.
const FieldManager = "karpenter-clusterapi"

// Hub is the management cluster: a cache scoped to the configured
// namespace and Cluster, and a client that writes to it.
type Hub struct {
	cluster.Cluster
	Scope Scope
	// Reachability tells when the API server answers again after an outage.
	Reachability *Reachability
}

// New builds the hub's cache and client. The cache only ever holds objects in
// scope: with a namespace set, informers watch that namespace alone (so a
// namespaced Role suffices); with a cluster name set, Machines,
// MachineSets and MachineDeployments are also filtered by the cluster-name
// label on the server, and Clusters by name: another Cluster of a shared
// namespace is never read.
//
// While the hub's API server is unreachable, the cache's informers wait for
// it (see Reachability) rather than back off: they resume within a second of
// its return.
func New(cfg *rest.Config, scheme *runtime.Scheme, scope Scope) (*Hub, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = userAgent(cfg.UserAgent)
	reachability, err := NewReachability(cfg, log.Log.WithName("hub"))
	if err != nil {
		return nil, fmt.Errorf("building management cluster client: %w", err)
	}
	cacheOpts := cache.Options{Scheme: scheme, NewInformer: reachability.newInformer}
	if scope.Namespace != "" {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{scope.Namespace: {}}
	}
	if sel := scope.clusterSelector(); sel != nil {
		cacheOpts.ByObject = map[client.Object]cache.ByObject{
			&clusterv1.Machine{}:           {Label: sel},
			&clusterv1.MachineDeployment{}: {Label: sel},
			&clusterv1.MachineSet{}:        {Label: sel},
			&clusterv1.Cluster{}:           {Field: fields.OneTermEqualSelector("metadata.name", scope.ClusterName)},
		}
	}
	c, err := cluster.New(cfg, func(o *cluster.Options) {
		o.Scheme = scheme
		o.Cache = cacheOpts
		// Infrastructure and bootstrap templates of any provider are read as
		// unstructured objects; serve them from informers too.
		o.Client = client.Options{Cache: &client.CacheOptions{Unstructured: true}}
	})
	if err != nil {
		return nil, fmt.Errorf("building management cluster client: %w", err)
	}
	return &Hub{Cluster: c, Scope: scope, Reachability: reachability}, nil
}

// CheckReachable asks the hub API server for its version, so that a wrong
// address or credential fails at start rather than as a stream of errors.
func CheckReachable(ctx context.Context, cfg *rest.Config, timeout time.Duration) error {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = timeout
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := dc.RESTClient().Get().AbsPath("/version").Do(ctx).Raw(); err != nil {
		return err
	}
	return nil
}

// userAgent names the product FieldManager, keeping the version of the
// user agent it replaces ("karpenter/v1.15.0" becomes
// "karpenter-clusterapi/v1.15.0").
func userAgent(old string) string {
	if _, rest, ok := strings.Cut(old, "/"); ok {
		return FieldManager + "/" + rest
	}
	return FieldManager
}
