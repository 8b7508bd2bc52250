package world

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// startPublished waits until the hub's API server converts the published
// kinds through the world's webhook server (their CRDs are installed before
// the controllers start), and starts the simulated kubeadm control plane.
func (w *World) startPublished(ctx context.Context) error {
	// The API server reaches the conversion webhook: a v1beta1 Cluster, as
	// clusterctl templates write it, is accepted (dry run).
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{
			"infrastructureRef": map[string]any{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "AWSCluster", "name": "probe"},
		}}}
		u.SetAPIVersion("cluster.x-k8s.io/v1beta1")
		u.SetKind("Cluster")
		u.SetNamespace(w.Namespace)
		u.SetName("conversion-probe")
		last = w.Hub.Client.Create(ctx, u, client.DryRunAll)
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for Cluster API's conversion webhooks: %w (last: %v)", err, last)
	}
	w.kcp = newSimKCP()
	mgr, err := newKCPManager(w.Hub.Config, w.kcp, w.log.WithName("kubeadm-control-plane"))
	if err != nil {
		return err
	}
	w.startManager(mgr)
	return nil
}

// PrepareCluster starts the workload cluster of a Cluster that a test will
// create itself, in the world's Namespace, from a clusterctl template or a
// ClusterClass (needs Options.Published): an API server with the Karpenter
// and NodeClass CRDs, kube-scheduler, kube-controller-manager and a
// simulated kubelet for the instances of the Cluster's Machines. It creates
// nothing in the hub: SimAWS gives the Cluster's AWSCluster this API
// server's address as control plane endpoint, and the simulated kubeadm
// control plane writes the "<name>-kubeconfig" Secret for it. Wait for the
// Cluster with WaitClusterReady once its objects exist. Stop stops it with
// the world.
func (w *World) PrepareCluster(ctx context.Context, name string) (*WorkloadCluster, error) {
	if w.kcp == nil {
		return nil, errors.New("PrepareCluster needs a world started with Options.Published")
	}
	if w.Cluster(name) != nil {
		return nil, fmt.Errorf("the world has a Cluster %s already", name)
	}
	spoke, err := environment.StartSpoke()
	if err != nil {
		return nil, fmt.Errorf("preparing Cluster %s: %w", name, err)
	}
	spoke.Name = "spoke-" + name
	wc := &WorkloadCluster{Namespace: w.Namespace, Name: name, Spoke: spoke, logSuffix: "-" + name}
	w.mu.Lock()
	w.clusters = append(w.clusters, wc) // Stop stops it from now on
	w.mu.Unlock()
	if wc.SpokeKubeconfig, err = spoke.WriteKubeconfig(w.Dir); err != nil {
		return nil, err
	}
	mgr, err := newSpokeManager(spoke.Config, w.AWS, w.clusterKey(wc), w.readyDelay, w.pullDelay, w.joinMode, w.kubeletHeld, w.log.WithName("kubelet-"+name))
	if err != nil {
		return nil, err
	}
	w.startManager(mgr)
	if err := w.startSpokeComponents(ctx, wc); err != nil {
		return nil, fmt.Errorf("preparing Cluster %s: %w", name, err)
	}
	u, err := url.Parse(spoke.Config.Host)
	if err != nil {
		return nil, err
	}
	host, portStr, err := net.SplitHostPort(u.Host)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, err
	}
	w.kcp.addSpoke(w.clusterKey(wc), spoke.Config)
	w.AWS.SetControlPlaneEndpoint(w.clusterKey(wc), host, int32(port))
	return wc, nil
}

// WaitClusterReady waits until Cluster API sees the Cluster's
// infrastructure provisioned, its control plane initialized and its
// workload cluster reachable.
func (w *World) WaitClusterReady(ctx context.Context, name string) error {
	wc := w.Cluster(name)
	if wc == nil {
		return fmt.Errorf("the world has no Cluster %s", name)
	}
	return w.waitClusterReady(ctx, wc)
}
