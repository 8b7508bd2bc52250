package machinedeployment

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
)

func isMarked(m *clusterv1.Machine) bool {
	_, ok := m.Annotations[clusterv1.DeleteMachineAnnotation]
	return ok
}

// stranded decides about a reservation that no Machine can be bound to:
// it is older than OrphanGrace, the MachineSet has settled (as many live
// Machines as replicas: it creates no more) and no bindable Machine made
// after the raise is left. That happens when
//
//   - someone else lowered the replicas before the MachineSet made the
//     Machine (or the MachineSet deleted the new, Node-less one first): the
//     replica was taken away, so the reservation is dropped and its owned
//     replica forgotten (replicas unchanged: opLost); or
//   - the Machine made for the raise got a Node before it was bound (the
//     provider was down or its cache lagged), or, when every replica is
//     Karpenter's, a rollout left an unbound Machine made before the
//     raise: a Machine with a Node is never bound (someone may run
//     workloads on it), so the replica is given back with that Machine
//     (marked, the MachineSet removes it).
//
// Either way the NodeClaim's next Create raises a replica again, and the
// pods get a node instead of waiting for Karpenter's registration timeout.
// It returns the op to apply, or nil when the reservation may still bind.
func (c *Controller) stranded(ctx context.Context, md *clusterv1.MachineDeployment, claim string, since time.Time, use usage, taken map[string]bool, now time.Time) (*op, error) {
	replicas := int32(0)
	if md.Spec.Replicas != nil {
		replicas = *md.Spec.Replicas
	}
	if now.Sub(since) < OrphanGrace || replicas != use.live {
		return nil, nil
	}
	key := client.ObjectKeyFromObject(md)
	p := c.provider
	// Decide on a live read: the cache may not show a binding made just
	// now (by a process before a restart, which this one does not
	// remember), and the MachineDeployment and its Machines come from two
	// watches that lag apart, so the cache can look settled while the
	// MachineSet still removes a released Machine.
	liveMD := &clusterv1.MachineDeployment{}
	if err := p.hub.GetAPIReader().Get(ctx, key, liveMD); err != nil {
		return nil, fmt.Errorf("reading MachineDeployment %s: %w", key, err)
	}
	live := &clusterv1.MachineList{}
	if err := p.hub.GetAPIReader().List(ctx, live, client.InNamespace(md.Namespace),
		client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
		return nil, fmt.Errorf("listing Machines of MachineDeployment %s: %w", key, err)
	}
	if pending, err := hub.PendingNodeClaims(liveMD); err != nil {
		return nil, err
	} else if _, ok := pending[claim]; !ok {
		return nil, nil // settled since the cache's read
	}
	replicas = ptr.Deref(liveMD.Spec.Replicas, 0)
	owned, _, err := ownedReplicas(liveMD)
	if err != nil {
		return nil, err
	}
	var liveCount, unbound int32
	keptReleased := false
	for i := range live.Items {
		m := &live.Items[i]
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		liveCount++
		if taken[m.Name] {
			continue // bound or given back in this pass
		}
		switch bound := m.Annotations[v1alpha1.NodeClaimAnnotation]; {
		case bound == claim && !isMarked(m):
			return nil, nil // bound meanwhile
		case bound != "" && isMarked(m):
			keptReleased = true
		case bound == "" && (!isMarked(m) || spareMarked(m)):
			unbound++
		}
	}
	if liveCount != replicas {
		return nil, nil // the MachineSet is still at work
	}
	if keptReleased {
		// A released or given-back Machine the MachineSet kept (someone
		// raised, often Karpenter for another NodeClaim or for this one
		// again, as it was marked) stands in this replica's place. It goes
		// (deleteKeptReleased, deleteKeptSpares, or the spare logic), and
		// the MachineSet makes the Machine for this replica.
		// Dropping the reservation as lost instead handed the replica to
		// no one: an unbound Machine for ever (conformance, StaticCapacity
		// drift).
		return nil, nil
	}
	victim := pickVictim(use.victims, taken, since.Add(-bindSkew))
	if others := replicas - owned; victim == nil && (others <= 0 || unbound > others) {
		// More unbound Machines than replicas of others': one of them is
		// Karpenter's by the count, whenever it was made (a rollout
		// replaced a bound Machine with an unbound one; a Machine made
		// for someone else's raise, or a MachineHealthCheck's
		// replacement, was bound to an older reservation in this one's
		// place). It goes with the replica.
		victim = pickVictim(use.victims, taken, time.Time{})
	}
	if victim != nil {
		// errMachineChanged: the victim was bound or changed since the
		// cache's read; the caller decides again on a fresh one.
		if err := p.markSpare(ctx, victim); err != nil {
			return nil, err
		}
		p.inflight.Delete(claim) // the next Create raises again
		taken[victim.Name] = true
		log.FromContext(ctx).Info("giving back a reservation whose Machine came up unbound", "MachineDeployment", key, "NodeClaim", claim, "Machine", victim.Name)
		c.event(c.hubEvents, md, corev1.EventTypeNormal, "ReplicaGivenBack",
			fmt.Sprintf("Machine %s made for NodeClaim %s got a Node before it was bound: replica given back with it, the NodeClaim raises again", victim.Name, claim))
		metrics.OrphansReleased.WithLabelValues("replica").Inc()
		return &op{kind: opGiveBack, name: claim}, nil
	}
	if replicas >= owned {
		// No replica of Karpenter's was taken away, yet no Machine is
		// left for this one: the count is off (NodeClaims hold more than
		// counted). Dropping the reservation would hand a replica to no
		// one; it waits, and the NodeClaim's timeout ends it.
		log.FromContext(ctx).Info("a reservation has no Machine, but no replica was taken away: waiting", "MachineDeployment", key, "NodeClaim", claim,
			"replicas", replicas, "owned", owned, "unbound", unbound)
		return nil, nil
	}
	p.inflight.Delete(claim) // the next Create raises again
	log.FromContext(ctx).Info("dropping a reservation whose replica someone else took away", "MachineDeployment", key, "NodeClaim", claim, "replicas", replicas)
	c.event(c.hubEvents, md, corev1.EventTypeNormal, "ReservationLost",
		fmt.Sprintf("the replica raised for NodeClaim %s was taken away (replicas lowered by someone else): the NodeClaim raises again", claim))
	return &op{kind: opLost, name: claim}, nil
}
