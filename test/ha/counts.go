package ha

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// Counts is what a pool has in both clusters at one moment.
type Counts struct {
	RunningPods, PendingPods int
	NodeClaims               int // including those being deleted
	NodeClaimsDeleting       int
	Nodes                    int
	Machines                 int // labelled pool=<name>, including those being deleted
	MachinesDeleting         int // of Machines, those with a deletion timestamp
	UnboundMachines          int // without the NodeClaim annotation
	MachineNames             []string
	Replicas                 int32 // MachineDeployment mode: the pool's MachineDeployments' replicas
}

func (c Counts) String() string {
	return fmt.Sprintf("pods running=%d pending=%d, nodeclaims=%d, nodes=%d, machines=%d unbound=%d, replicas=%d",
		c.RunningPods, c.PendingPods, c.NodeClaims, c.Nodes, c.Machines, c.UnboundMachines, c.Replicas)
}

// Settled is true when every Karpenter object of the pool matches one
// another and n.
func (c Counts) Settled(n int) bool {
	return c.NodeClaims == n && c.Nodes == n && c.Machines == n && c.UnboundMachines == 0
}

// Count reads a pool's counts from the API servers; app selects the pods
// ("" for none). Machines are listed before NodeClaims: a NodeClaim exists
// before its Machine and is deleted only after it, so Machines > NodeClaims
// in one Count is a real excess, never an artefact of the order.
func Count(ctx context.Context, w *world.World, pool, app string) (Counts, error) {
	var c Counts
	machines := &clusterv1.MachineList{}
	if err := w.Hub.Client.List(ctx, machines, client.InNamespace(w.Namespace), client.MatchingLabels{poolLabel: pool}); err != nil {
		return c, err
	}
	for _, m := range machines.Items {
		c.Machines++
		c.MachineNames = append(c.MachineNames, m.Name)
		if !m.DeletionTimestamp.IsZero() {
			c.MachinesDeleting++
		}
		if m.Annotations[v1alpha1.NodeClaimAnnotation] == "" {
			c.UnboundMachines++
		}
	}
	mds := &clusterv1.MachineDeploymentList{}
	if err := w.Hub.Client.List(ctx, mds, client.InNamespace(w.Namespace), client.MatchingLabels{poolLabel: pool}); err != nil {
		return c, err
	}
	for _, md := range mds.Items {
		if md.Spec.Replicas != nil {
			c.Replicas += *md.Spec.Replicas
		}
	}
	return c, countSpoke(ctx, w, pool, app, &c)
}

// CountSpoke is Count without the hub (which may be down).
func CountSpoke(ctx context.Context, w *world.World, pool, app string) (Counts, error) {
	var c Counts
	return c, countSpoke(ctx, w, pool, app, &c)
}

func countSpoke(ctx context.Context, w *world.World, pool, app string, c *Counts) error {
	ncs := &karpv1.NodeClaimList{}
	if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
		return err
	}
	c.NodeClaims = len(ncs.Items)
	for _, nc := range ncs.Items {
		if !nc.DeletionTimestamp.IsZero() {
			c.NodeClaimsDeleting++
		}
	}
	nodes := &corev1.NodeList{}
	if err := w.Spoke.Client.List(ctx, nodes, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
		return err
	}
	c.Nodes = len(nodes.Items)
	if app == "" {
		return nil
	}
	pods := &corev1.PodList{}
	if err := w.Spoke.Client.List(ctx, pods, client.MatchingLabels{"app": app}); err != nil {
		return err
	}
	for _, p := range pods.Items {
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != "" {
			c.RunningPods++
		} else {
			c.PendingPods++
		}
	}
	return nil
}
