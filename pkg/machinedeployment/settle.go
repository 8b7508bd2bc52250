package machinedeployment

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
)

// settleOwned decides what to do about owned replicas no NodeClaim uses
// (debt > 0) or NodeClaims holding more than is counted (debt < 0), once
// that has lasted OrphanGrace: give a spare replica back with an unbound
// Machine, forget it when someone else lowered the replicas already, or
// count again. It returns the op to apply (or nil) and when to look again.
func (c *Controller) settleOwned(ctx context.Context, md *clusterv1.MachineDeployment, owned int32, hasOwned bool, debt int32, use usage, taken map[string]bool, now time.Time) (*op, time.Duration, error) {
	key := client.ObjectKeyFromObject(md)
	if !hasOwned {
		return &op{kind: opSetOwned, bound: use.bound, expect: -1}, 0, nil
	}
	if debt == 0 {
		c.debts.clear(key)
		return nil, 0, nil
	}
	pending, err := hub.PendingNodeClaims(md)
	if err != nil {
		return nil, 0, err
	}
	pendingAt := make(map[string]bool, len(pending))
	for claim := range pending {
		pendingAt[claim] = true
	}
	since := c.debts.observe(key, debt > 0, now)
	if wait := OrphanGrace - now.Sub(since); wait > 0 {
		return nil, wait, nil
	}
	if c.debts.stale(key, owned, now) {
		return nil, time.Second, nil
	}
	if debt < 0 {
		// NodeClaims hold more than is counted. Raising the count would
		// take replicas from whoever else set them (invariant 4), so it
		// stays: releases at a count of 0 keep the replicas rather than
		// take someone else's.
		log.FromContext(ctx).Info("NodeClaims hold more replicas than counted; leaving the count", "MachineDeployment", key, "owned", owned, "bound", use.bound)
		return nil, OrphanGrace, nil
	}
	if victim := pickVictim(use.victims, taken, time.Time{}); victim != nil {
		log.FromContext(ctx).Info("giving back a replica no NodeClaim uses", "MachineDeployment", key, "Machine", victim.Name)
		if err := c.provider.markSpare(ctx, victim); errors.Is(err, errMachineChanged) {
			return nil, time.Second, nil // bound or changed since the cache's read: decide again
		} else if err != nil {
			return nil, 0, err
		}
		c.event(c.hubEvents, md, corev1.EventTypeNormal, "SpareReplicaGivenBack",
			fmt.Sprintf("a Karpenter Machine was deleted by someone else and no NodeClaim took its replica: given back with Machine %s", victim.Name))
		metrics.OrphansReleased.WithLabelValues("spare").Inc()
		return &op{kind: opSpare, expect: owned, pendingAt: pendingAt, marked: victim}, time.Second, nil
	}
	replicas := int32(0)
	if md.Spec.Replicas != nil {
		replicas = *md.Spec.Replicas
	}
	if replicas != use.live {
		// The MachineSet has yet to create or delete Machines: decide on
		// what it settles to.
		return nil, 5 * time.Second, nil
	}
	if len(use.released) > 0 {
		// The MachineSet keeps a Machine whose replica was given back:
		// another Karpenter Machine went in its place (both were marked; a
		// termination interrupted between marking and giving back leaves
		// one so). The spare replica is that Machine's.
		victim := use.released[0]
		log.FromContext(ctx).Info("giving back a replica no NodeClaim uses", "MachineDeployment", key, "Machine", victim.Name)
		c.event(c.hubEvents, md, corev1.EventTypeNormal, "SpareReplicaGivenBack",
			fmt.Sprintf("a Karpenter Machine went in place of Machine %s, released already: its replica given back", victim.Name))
		metrics.OrphansReleased.WithLabelValues("spare").Inc()
		return &op{kind: opSpare, expect: owned, pendingAt: pendingAt, marked: victim}, time.Second, nil
	}
	// Forgetting hands the replica to others: only when they took one of
	// Karpenter's (fewer replicas than owned), on a live read (the caches
	// of MachineDeployments and Machines lag apart). Otherwise no replica
	// was taken away and the count waits (invariant 4b).
	live := &clusterv1.MachineDeployment{}
	if err := c.provider.hub.GetAPIReader().Get(ctx, key, live); err != nil {
		return nil, 0, fmt.Errorf("reading MachineDeployment %s: %w", key, err)
	}
	liveOwned, _, err := ownedReplicas(live)
	if err != nil {
		return nil, 0, err
	}
	if r := ptr.Deref(live.Spec.Replicas, 0); r >= liveOwned || liveOwned != owned {
		return nil, OrphanGrace, nil
	}
	log.FromContext(ctx).Info("forgetting a replica someone else took away", "MachineDeployment", key, "replicas", replicas, "owned", owned, "bound", use.bound)
	return &op{kind: opForgive, expect: owned, pendingAt: pendingAt}, time.Second, nil
}
