package operator

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/operator/options"
)

// discoverScope returns the scope to serve. Without --cluster-api-cluster-name
// a provider would take every Cluster's Machines in its namespace (or the
// whole hub) for its own, and release other Clusters' Machines whose
// NodeClaims it cannot find: it serves the one Cluster in its scope, and
// refuses to start when there is none or more than one.
func discoverScope(ctx context.Context, cfg *rest.Config, scope hub.Scope) (hub.Scope, error) {
	if scope.ClusterName != "" {
		return scope, nil
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return scope, fmt.Errorf("--%s: %w", options.FlagClusterAPIKubeconfig, err)
	}
	list := &clusterv1.ClusterList{}
	if err := c.List(ctx, list, scope.NamespaceListOptions()...); err != nil {
		return scope, fmt.Errorf("--%s is unset and the Clusters of the management cluster cannot be listed to find the one this provider serves: %w", options.FlagClusterAPICluster, err)
	}
	return pickCluster(scope, list.Items, func(name string) {
		log.FromContext(ctx).Info("serving the only Cluster in scope (--"+options.FlagClusterAPICluster+" unset)", "cluster", name)
	})
}

// pickCluster scopes to the only Cluster of clusters, or explains in one
// line why it cannot.
func pickCluster(scope hub.Scope, clusters []clusterv1.Cluster, found func(string)) (hub.Scope, error) {
	where := "the management cluster"
	if scope.Namespace != "" {
		where = "namespace " + scope.Namespace
	}
	switch len(clusters) {
	case 1:
		scope.Namespace, scope.ClusterName = clusters[0].Namespace, clusters[0].Name
		found(scope.Namespace + "/" + scope.ClusterName)
		return scope, nil
	case 0:
		return scope, fmt.Errorf("--%s is unset and %s holds no Cluster: set --%s (CLUSTER_API_CLUSTER_NAME) to the Cluster whose workload cluster this is",
			options.FlagClusterAPICluster, where, options.FlagClusterAPICluster)
	default:
		names := make([]string, 0, len(clusters))
		for i := range clusters {
			names = append(names, clusters[i].Namespace+"/"+clusters[i].Name)
		}
		if len(names) > 5 {
			names = append(names[:5], "...")
		}
		return scope, fmt.Errorf("--%s is unset and %s holds %d Clusters (%s): set --%s (CLUSTER_API_CLUSTER_NAME) and --%s to the Cluster whose workload cluster this is, or the provider would take the other Clusters' Machines for its own",
			options.FlagClusterAPICluster, where, len(clusters), strings.Join(names, ", "), options.FlagClusterAPICluster, options.FlagClusterAPINamespace)
	}
}
