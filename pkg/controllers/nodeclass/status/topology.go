package status

import (
	"context"
	"fmt"
	"sort"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
)

// Reasons of the TopologyReplicas condition.
const (
	ReasonReplicasFree   = "ReplicasFree"
	ReasonReplicasPinned = "ReplicasPinnedByTopology"
)

// The rule Cluster API's topology controller follows (exp/topology/
// desiredstate: the MachineDeployment's desired replicas are the worker's
// spec.topology.workers.machineDeployments[].replicas): a worker whose
// topology sets replicas has them set back at every reconcile, so any
// replica Karpenter adds is taken away again; a worker whose topology
// leaves replicas unset keeps whatever replicas its MachineDeployment has
// (the cluster autoscaler's rule). setTopologyCondition reports the first
// case for the MachineDeployments a NodeClass selects.
func (c *Controller) setTopologyCondition(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass) error {
	if nc.Spec.ScalableResourceSelector == nil {
		_ = nc.StatusConditions().Clear(v1alpha1.ConditionTypeTopologyReplicas)
		return nil
	}
	pinned, err := c.pinnedByTopology(ctx, nc.Spec.ScalableResourceSelector)
	if err != nil {
		return err
	}
	if len(pinned) == 0 {
		nc.StatusConditions().SetTrueWithReason(v1alpha1.ConditionTypeTopologyReplicas, ReasonReplicasFree, "")
		return nil
	}
	nc.StatusConditions().SetFalse(v1alpha1.ConditionTypeTopologyReplicas, ReasonReplicasPinned, truncate(
		strings.Join(pinned, "; ")+": the topology controller sets their replicas back; leave replicas unset on a worker Karpenter scales"))
	return nil
}

// pinnedByTopology describes each selected member MachineDeployment owned
// by a Cluster topology whose worker sets replicas.
func (c *Controller) pinnedByTopology(ctx context.Context, selector *metav1.LabelSelector) ([]string, error) {
	sel, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil {
		return nil, nil // the InstanceTypesResolved condition says so
	}
	mds := &clusterv1.MachineDeploymentList{}
	sel = hub.HasLabel(hub.HasLabel(sel, v1alpha1.KarpenterMemberLabel), clusterv1.ClusterTopologyOwnedLabel)
	if err := c.hub.GetCache().List(ctx, mds, c.hub.Scope.ListOptions(sel)...); err != nil {
		return nil, fmt.Errorf("listing MachineDeployments: %w", err)
	}
	var out []string
	for i := range mds.Items {
		md := &mds.Items[i]
		if !c.hub.Scope.Contains(md, md.Spec.ClusterName) {
			continue
		}
		worker := md.Labels[clusterv1.ClusterTopologyMachineDeploymentNameLabel]
		cluster := &clusterv1.Cluster{}
		if err := c.hub.GetCache().Get(ctx, types.NamespacedName{Namespace: md.Namespace, Name: md.Spec.ClusterName}, cluster); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("reading Cluster %s/%s: %w", md.Namespace, md.Spec.ClusterName, err)
		}
		for _, w := range cluster.Spec.Topology.Workers.MachineDeployments {
			if w.Name == worker && w.Replicas != nil {
				out = append(out, fmt.Sprintf("MachineDeployment %s/%s: Cluster %s/%s sets spec.topology.workers.machineDeployments[name=%s].replicas to %d",
					md.Namespace, md.Name, cluster.Namespace, cluster.Name, worker, *w.Replicas))
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// clusterChanges makes a change to a Cluster in the hub (its topology)
// refresh every NodeClass.
func (c *Controller) clusterChanges() source.Source {
	return source.Kind(c.hub.GetCache(), client.Object(&clusterv1.Cluster{}),
		handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
			return c.allNodeClasses(ctx)
		}))
}
