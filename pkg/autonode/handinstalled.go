package autonode

import (
	"context"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// handInstalledInHub names a provider Deployment in the Cluster's namespace
// of the management cluster that AutoNode did not create and that serves,
// or may serve, the Cluster (topology (b) by hand), or "". A Deployment
// whose container names another Cluster (--cluster-api-cluster-name or
// CLUSTER_API_CLUSTER_NAME) does not; one whose scope cannot be read from
// its pod template (a ConfigMap of settings) may, and counts.
func handInstalledInHub(ctx context.Context, hub client.Reader, c *clusterv1.Cluster) (string, error) {
	list := &appsv1.DeploymentList{}
	if err := hub.List(ctx, list, client.InNamespace(c.Namespace), client.MatchingLabels{nameLabel: providerName}); err != nil {
		return "", fmt.Errorf("listing Deployments labelled %s=%s in namespace %s: %w", nameLabel, providerName, c.Namespace, err)
	}
	for _, d := range list.Items {
		if d.Labels[ManagedByLabel] == ManagedBy {
			continue
		}
		if name, ok := scopedClusterName(&d); ok && name != c.Name {
			continue
		}
		return fmt.Sprintf("Deployment %s/%s in the management cluster", d.Namespace, d.Name), nil
	}
	return "", nil
}

// scopedClusterName is the Cluster a provider Deployment names in its pod
// template, and whether it names one.
func scopedClusterName(d *appsv1.Deployment) (string, bool) {
	flag := "--cluster-api-cluster-name="
	for _, ctr := range d.Spec.Template.Spec.Containers {
		for _, a := range append(append([]string(nil), ctr.Command...), ctr.Args...) {
			if v, ok := strings.CutPrefix(a, flag); ok {
				return v, true
			}
		}
		for _, e := range ctr.Env {
			if e.Name == "CLUSTER_API_CLUSTER_NAME" && e.ValueFrom == nil {
				return e.Value, true
			}
		}
	}
	return "", false
}
