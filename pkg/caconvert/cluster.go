package caconvert

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CheckWorkload tells whether the workload client (talking to host) is the
// workload cluster of cluster ("<namespace>/<name>"), before --apply writes
// NodeClasses and NodePools there. It is when its server is the one in
// Cluster API's <cluster>-kubeconfig Secret, or when a Node's providerID is a
// Machine's of the Cluster (a server reached by another address). Neither:
// an error naming both clusters.
func CheckWorkload(ctx context.Context, hub, workload client.Client, host, cluster string) error {
	ns, name, _ := strings.Cut(cluster, "/")
	secretServer, secretErr := kubeconfigServer(ctx, hub, ns, name)
	if secretErr == nil && sameServer(secretServer, host) {
		return nil
	}
	matched, err := nodesMatchMachines(ctx, hub, workload, ns, name)
	if err != nil {
		return fmt.Errorf("cannot tell whether --kubeconfig (%s) is the workload cluster of Cluster %s: %w", host, cluster, err)
	}
	if matched {
		return nil
	}
	why := fmt.Sprintf("its Secret %s/%s-kubeconfig names server %s", ns, name, secretServer)
	if secretErr != nil {
		why = secretErr.Error()
	}
	return fmt.Errorf("--kubeconfig (server %s) is not the workload cluster of Cluster %s: %s, and no Node there has the providerID of a Machine of the Cluster", host, cluster, why)
}

// kubeconfigServer reads the server of Cluster API's kubeconfig Secret.
func kubeconfigServer(ctx context.Context, hub client.Client, ns, cluster string) (string, error) {
	s := &corev1.Secret{}
	if err := hub.Get(ctx, client.ObjectKey{Namespace: ns, Name: cluster + "-kubeconfig"}, s); err != nil {
		return "", fmt.Errorf("reading Secret %s/%s-kubeconfig: %w", ns, cluster, err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(s.Data["value"])
	if err != nil {
		return "", fmt.Errorf("Secret %s/%s-kubeconfig, key value: %w", ns, cluster, err)
	}
	return cfg.Host, nil
}

func sameServer(a, b string) bool {
	norm := func(s string) string {
		u, err := url.Parse(strings.TrimSpace(s))
		if err != nil || u.Host == "" {
			return strings.TrimRight(strings.ToLower(s), "/")
		}
		host := strings.ToLower(u.Host)
		if u.Port() == "" && u.Scheme == "https" {
			host += ":443"
		}
		return host + strings.TrimRight(u.Path, "/")
	}
	return norm(a) == norm(b)
}

// nodesMatchMachines reports whether a Node of the workload client has the
// providerID of a Machine of the Cluster.
func nodesMatchMachines(ctx context.Context, hub, workload client.Client, ns, cluster string) (bool, error) {
	machines := &clusterv1.MachineList{}
	if err := hub.List(ctx, machines, client.InNamespace(ns), client.MatchingLabels{clusterv1.ClusterNameLabel: cluster}); err != nil {
		return false, fmt.Errorf("listing Machines of Cluster %s/%s: %w", ns, cluster, err)
	}
	ids := map[string]bool{}
	for _, m := range machines.Items {
		if m.Spec.ProviderID != "" {
			ids[m.Spec.ProviderID] = true
		}
	}
	if len(ids) == 0 {
		return false, nil
	}
	nodes := &corev1.NodeList{}
	if err := workload.List(ctx, nodes); err != nil {
		return false, fmt.Errorf("listing Nodes: %w", err)
	}
	for _, n := range nodes.Items {
		if ids[n.Spec.ProviderID] {
			return true, nil
		}
	}
	return false, nil
}
