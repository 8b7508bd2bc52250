package machinedeployment

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/failpoint"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
)

// A launch whose MachineSet is behind moves (design doc, "Launch's wait"):
// a reservation that has waited MoveAfter with no Machine made for it is
// left on its MachineDeployment as a free reservation (re-keyed, so that no
// NodeClaim has it: taken by the next NodeClaim or given back with the
// Machine made for it, as any free reservation), and the NodeClaim reserves
// on another member of the same offering whose MachineSet is not behind.
// Replicas and counts do not change on the first MachineDeployment, so no
// invariant is at stake there; the NodeClaim holds a reservation on one
// MachineDeployment at a time (none between the two writes: a crash there
// raises again on the one recorded on the NodeClaim).

// movedPrefix starts the key of a reservation whose NodeClaim moved on. No
// NodeClaim is named so (':' is not allowed in a name): the reservation is
// free from the start, without asking the spoke.
const movedPrefix = "moved:"

// isMoved reports whether a reservation key is one a launch moved away from.
func isMoved(key string) bool { return strings.HasPrefix(key, movedPrefix) }

// movedKey is the key the claim's reservation is kept under once its
// launch moves: unique among the reservations.
func movedKey(pending map[string]time.Time, claim string) string {
	k := movedPrefix + claim
	for i := 2; ; i++ {
		if _, taken := pending[k]; !taken {
			return k
		}
		k = fmt.Sprintf("%s%s:%d", movedPrefix, claim, i)
	}
}

// moveIfBehind moves the claim's launch off md when its reservation,
// stamped at, has waited MoveAfter and another member of the same offering
// is not behind: it records the new choice, re-keys the reservation on md
// (the writer refuses when a Machine is bound to the claim, or one it can
// be bound to exists) and reserves on the new one. It returns the
// MachineDeployment reserved on, or nil when the launch stays.
func (p *Provider) moveIfBehind(ctx context.Context, claim string, md types.NamespacedName, at time.Time, record func(types.NamespacedName), choose Choose) (*types.NamespacedName, error) {
	if at.IsZero() || p.now().Sub(at) < p.MoveAfter {
		return nil, nil
	}
	src, err := choose(&md)
	if err != nil || src.Origin == md || !p.usable(src.Origin) || p.behind(ctx, src.Origin) || p.full(ctx, src.Origin) {
		return nil, nil // no other member, or it is behind or full too: the launch waits here
	}
	to := src.Origin
	// Recorded before the move, so that a retry after an ambiguous move
	// raises there, and back when the NodeClaim stays: a Machine bound to
	// it here that the cache does not show (bound by the process before a
	// restart) keeps a retry from raising anywhere (the reserving write
	// sees it), which it would not on the other MachineDeployment.
	record(to)
	in := &intent{kind: intentMove, claim: claim}
	if err := p.writer.do(ctx, md, in); err != nil {
		record(md)
		return nil, fmt.Errorf("moving the reservation of NodeClaim %s off MachineDeployment %s: %w", claim, md, err)
	}
	if !in.done {
		if in.stays {
			record(md) // bound meanwhile, or a Machine for it is there
		}
		return nil, nil // or the cache was behind: it is reserved elsewhere already
	}
	failpoint.Crash(StepMove)
	metrics.OrphansReleased.WithLabelValues("moved").Inc()
	log.FromContext(ctx).Info("launch moved: its MachineSet made no Machine for it", "NodeClaim", claim, "from", md, "to", to,
		"reserved", at.UTC().Format(time.RFC3339), "waited", p.now().Sub(at).Round(time.Second))
	if p.Events != nil {
		ref := &clusterv1.MachineDeployment{}
		if err := p.hub.GetCache().Get(ctx, md, ref); err == nil {
			p.Events.Event(ref, corev1.EventTypeNormal, "LaunchMoved", fmt.Sprintf(
				"NodeClaim %s waited %s for a Machine of this MachineDeployment's MachineSet and moved to MachineDeployment %s; its replica stays, free for the next NodeClaim or given back with the Machine made for it",
				claim, p.now().Sub(at).Round(time.Second), to))
		}
	}
	reserved, err := p.reserve(ctx, claim, &to, record, choose)
	if err != nil {
		return &to, err
	}
	return reserved, nil
}

// behind reports whether a MachineDeployment's MachineSet is behind its
// reservations, from the cache: one has waited MoveAfter with no Machine
// bound to it and none made since its stamp that is free to take it.
func (p *Provider) behind(ctx context.Context, key types.NamespacedName) bool {
	md := &clusterv1.MachineDeployment{}
	if err := p.hub.GetCache().Get(ctx, key, md, client.UnsafeDisableDeepCopy); err != nil {
		return true // unreadable: no place to move to
	}
	pending, err := hub.PendingNodeClaims(md)
	if err != nil || len(pending) == 0 {
		return err != nil
	}
	machines, err := machinesOf(ctx, p.hub.GetCache(), md)
	if err != nil {
		return true
	}
	bound := map[string]bool{}
	var newestFree time.Time // the newest live, unbound, unmarked Machine
	for _, m := range machines {
		if !m.DeletionTimestamp.IsZero() || isMarked(m) {
			continue
		}
		if c := m.Annotations[v1alpha1.NodeClaimAnnotation]; c != "" {
			bound[c] = true
		} else if m.CreationTimestamp.After(newestFree) {
			newestFree = m.CreationTimestamp.Time
		}
	}
	for claim, raised := range pending {
		at, ok := stampOf(md, raised)
		if ok && p.now().Sub(at) >= p.MoveAfter && !bound[claim] && newestFree.Before(at.Truncate(time.Second)) {
			return true
		}
	}
	return false
}

// full reports whether a MachineDeployment cannot be raised (at its
// max-size, or its size annotations unreadable), from the cache: a launch
// moved there would be refused and deleted by core.
func (p *Provider) full(ctx context.Context, key types.NamespacedName) bool {
	md := &clusterv1.MachineDeployment{}
	if err := p.hub.GetCache().Get(ctx, key, md, client.UnsafeDisableDeepCopy); err != nil {
		return true
	}
	_, maxSize, hasMax, err := sizeBounds(md)
	return err != nil || hasMax && ptr.Deref(md.Spec.Replicas, 0)+1 > maxSize
}
