package machine

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	toolscache "k8s.io/client-go/tools/cache"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// The version new Machines get follows the control plane (clusterVersion),
// and it is a drift input: Karpenter re-checks drift at once only when the
// NodeClass's status.driftHash moves, which needs a resolution that sees
// the new version. The catalogue's memo would hide it (a control plane is
// not a template), so the catalogue watches the control plane kinds of the
// Clusters it resolves and counts the changes of the version they run.

// clusterVersionInputs reports whether what clusterVersion reads of a
// Cluster differs between two of its states: the control plane it
// references and the topology version.
func clusterVersionInputs(o, n *clusterv1.Cluster) bool {
	return o.Spec.ControlPlaneRef != n.Spec.ControlPlaneRef || o.Spec.Topology.Version != n.Spec.Topology.Version
}

// watchControlPlane makes the catalogue count version changes of the
// Cluster's control plane kind (a no-op when already watched, or when the
// Cluster has no control plane reference).
func (c *Catalogue) watchControlPlane(ctx context.Context, cluster *clusterv1.Cluster) error {
	ref := cluster.Spec.ControlPlaneRef
	if ref.Name == "" {
		return nil
	}
	gvk, err := ResolveKind(c.hub, ref.APIGroup, ref.Kind)
	if err != nil {
		return fmt.Errorf("Cluster %s/%s: spec.controlPlaneRef: %w", cluster.Namespace, cluster.Name, err)
	}
	if _, loaded := c.controlPlaneKinds.LoadOrStore(gvk, true); loaded {
		return nil
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	informer, err := c.hub.GetCache().GetInformer(ctx, u, cache.BlockUntilSynced(false))
	if err == nil {
		_, err = informer.AddEventHandler(c.controlPlaneHandler())
	}
	if err != nil {
		c.controlPlaneKinds.Delete(gvk)
		return fmt.Errorf("watching %s: %w", gvk.Kind, err)
	}
	return nil
}

// controlPlaneHandler counts control plane events that change the version
// it runs (controlPlaneVersion); a control plane's status moves often
// otherwise (replicas, conditions), and those change nothing resolved.
func (c *Catalogue) controlPlaneHandler() toolscache.ResourceEventHandlerFuncs {
	counted := c.counter(&c.controlPlanesVersion)
	bump := counted.AddFunc
	counted.UpdateFunc = func(oldObj, newObj any) {
		o, ok1 := oldObj.(*unstructured.Unstructured)
		n, ok2 := newObj.(*unstructured.Unstructured)
		if !ok1 || !ok2 || controlPlaneVersion(o, "") != controlPlaneVersion(n, "") {
			bump(newObj)
		}
	}
	return counted
}
