package autonode

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// WorkloadClients opens a client of a workload cluster from its kubeconfig.
type WorkloadClients func(kubeconfig []byte) (client.Client, error)

// workloadScheme: Karpenter's API package registers its kinds in
// client-go's scheme.
var workloadScheme = clientgoscheme.Scheme

// NewWorkloadClient is the default WorkloadClients: an uncached client, as
// the controller reads a workload cluster only on opt-in and opt-out.
func NewWorkloadClient(kubeconfig []byte) (client.Client, error) {
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("reading the kubeconfig: %w", err)
	}
	cfg.Timeout = 15 * time.Second
	cfg.UserAgent = ManagedBy
	return client.New(cfg, client.Options{Scheme: workloadScheme})
}

// observeWorkload counts Karpenter's NodePools and NodeClaims. A cluster
// without Karpenter's CRDs has neither.
func observeWorkload(ctx context.Context, wl client.Client) *WorkloadObservation {
	pools := &karpv1.NodePoolList{}
	if err := wl.List(ctx, pools); err != nil && !isNoKind(err) {
		return &WorkloadObservation{Err: fmt.Errorf("listing NodePools: %w", err)}
	}
	claims := &karpv1.NodeClaimList{}
	if err := wl.List(ctx, claims); err != nil && !isNoKind(err) {
		return &WorkloadObservation{Err: fmt.Errorf("listing NodeClaims: %w", err)}
	}
	o := &WorkloadObservation{NodeClaims: len(claims.Items)}
	for _, p := range pools.Items {
		if p.DeletionTimestamp.IsZero() {
			o.NodePools++
		}
	}
	return o
}

// deleteNodePools deletes every NodePool: core then terminates their
// NodeClaims (draining the nodes, honouring PodDisruptionBudgets) and the
// provider deletes their Machines.
func deleteNodePools(ctx context.Context, wl client.Client) error {
	pools := &karpv1.NodePoolList{}
	if err := wl.List(ctx, pools); err != nil {
		return fmt.Errorf("listing NodePools: %w", err)
	}
	for i := range pools.Items {
		p := &pools.Items[i]
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		if err := client.IgnoreNotFound(wl.Delete(ctx, p, client.PropagationPolicy("Background"))); err != nil {
			return fmt.Errorf("deleting NodePool %s: %w", p.Name, err)
		}
	}
	return nil
}

// handInstalledInWorkload names a provider Deployment in the workload
// cluster (topology (a) of docs/install.md: the chart's and kustomize's
// label app.kubernetes.io/name=karpenter-clusterapi), or "".
func handInstalledInWorkload(ctx context.Context, wl client.Client) (string, error) {
	list := &appsv1.DeploymentList{}
	if err := wl.List(ctx, list, client.MatchingLabels{nameLabel: providerName}); err != nil {
		return "", fmt.Errorf("listing Deployments labelled %s=%s in the workload cluster: %w", nameLabel, providerName, err)
	}
	for _, d := range list.Items {
		if d.Labels[ManagedByLabel] != ManagedBy {
			return fmt.Sprintf("Deployment %s/%s in the workload cluster", d.Namespace, d.Name), nil
		}
	}
	return "", nil
}

// isNoKind: the workload cluster does not serve the kind (no CRD yet).
func isNoKind(err error) bool {
	return meta.IsNoMatchError(err) || apierrors.IsNotFound(err)
}
