package machinedeployment

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
	"github.com/autonode/karpenter-clusterapi/pkg/spoke"
)

// adoptGrace is how long the controller leaves the Machine of a NodeClaim
// that went before it launched for a successor to adopt, before releasing
// it. Karpenter makes the successor within a provisioning batch or two.
const adoptGrace = 20 * time.Second

// goneMemory bounds how long a deleted NodeClaim is remembered.
const goneMemory = 10 * time.Minute

// goneSettled is how long after a NodeClaim's deletion a cache that shows
// no Machine bound to it is believed: far more than the cache lags.
const goneSettled = time.Minute

// goneClaimsSeen remembers the NodeClaims the spoke reported deleted.
type goneClaimsSeen struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (g *goneClaimsSeen) add(claim string, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.at == nil {
		g.at = map[string]time.Time{}
	}
	for c, t := range g.at {
		if now.Sub(t) > goneMemory {
			delete(g.at, c)
		}
	}
	g.at[claim] = now
}

func (g *goneClaimsSeen) forget(claim string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.at, claim)
}

// since returns when the claim was reported deleted.
func (g *goneClaimsSeen) since(claim string) (time.Time, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t, ok := g.at[claim]
	return t, ok
}

// oldestFirst lists the remembered claims, the earliest deleted first.
func (g *goneClaimsSeen) oldestFirst(now time.Time) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]string, 0, len(g.at))
	for c, t := range g.at {
		if now.Sub(t) <= goneMemory {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if ti, tj := g.at[out[i]], g.at[out[j]]; !ti.Equal(tj) {
			return ti.Before(tj)
		}
		return out[i] < out[j]
	})
	return out
}

// NodeClaimDeleted is told of every NodeClaim the spoke deletes (the
// controller's NodeClaim watch; the binding model calls it directly).
func (p *Provider) NodeClaimDeleted(claim string) { p.goneSeen.add(claim, p.now()) }

// adopt binds to claim a Machine of MachineDeployment md whose NodeClaim
// was deleted before it launched (Karpenter's launch timeout: the instance
// had no ID within five minutes), so that the successor Karpenter makes
// for the same pods uses the Machine already booting instead of raising a
// replica for a second one (make bench-1000: 36 NodeClaims timed out with
// their Machine bound, and each successor's raise made one Machine too
// many). It reports whether it bound one.
//
// The Machine qualifies only when its NodeClaim is gone by a live read,
// it is not marked or being deleted, and it has no Node that a NodeClaim
// registered (bindable's rule): the same Machines binding condition 3
// admits, made for a Karpenter raise. The take excludes the controller's
// release of that Machine (takeovers), and the patch carries the
// resourceVersion it was decided on. Any doubt leaves the Machine alone.
func (p *Provider) adopt(ctx context.Context, md types.NamespacedName, claim string) (bool, error) {
	if p.spoke == nil || p.spokeAPI == nil {
		return false, nil
	}
	now := p.now()
	for _, gone := range p.goneSeen.oldestFirst(now) {
		if gone == claim {
			continue
		}
		m, err := p.BoundMachine(ctx, gone)
		if err != nil {
			return false, err
		}
		if m == nil {
			if deleted, ok := p.goneSeen.since(gone); ok && now.Sub(deleted) > goneSettled {
				// Nothing of it left to adopt (released, or never bound),
				// long after the cache caught up with its last binding.
				p.goneSeen.forget(gone)
			}
			continue
		}
		if m.Namespace != md.Namespace || m.Labels[clusterv1.MachineDeploymentNameLabel] != md.Name || !p.adoptable(ctx, m) {
			continue
		}
		if !p.takeovers.take(gone, claim, now) {
			continue
		}
		ok, err := p.rebind(ctx, md, m, gone, claim)
		if !ok {
			p.takeovers.untake(gone, claim)
		}
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

// adoptable reports whether a bound Machine may change hands: live,
// unmarked, and without a Node a NodeClaim registered.
func (p *Provider) adoptable(ctx context.Context, m *clusterv1.Machine) bool {
	if _, marked := m.Annotations[clusterv1.DeleteMachineAnnotation]; marked || !m.DeletionTimestamp.IsZero() || p.released.has(m.Namespace+"/"+m.Name, p.now()) {
		return false
	}
	return noRegisteredNode(ctx, p.spoke, m)
}

// rebind moves Machine m from the gone NodeClaim to claim: first the gone
// claim's reservation, if still listed, is dropped (it was m's), then m's
// annotation is patched with an optimistic lock.
func (p *Provider) rebind(ctx context.Context, md types.NamespacedName, m *clusterv1.Machine, gone, claim string) (bool, error) {
	if isGone, err := spoke.NodeClaimGone(ctx, p.spoke, p.spokeAPI, gone, time.Time{}, p.now(), 0); err != nil || !isGone {
		return false, err
	}
	if err := p.scaler.Apply(ctx, md, &op{kind: opBound, name: gone}); err != nil {
		return false, fmt.Errorf("dropping the reservation of NodeClaim %s, gone, on MachineDeployment %s: %w", gone, md, err)
	}
	for attempt := 1; ; attempt++ {
		patch := client.MergeFromWithOptions(m.DeepCopy(), client.MergeFromWithOptimisticLock{})
		m.Annotations[v1alpha1.NodeClaimAnnotation] = claim
		err := p.hub.GetClient().Patch(ctx, m, patch)
		if err == nil {
			break
		}
		if apierrors.IsConflict(err) && attempt < bindAttempts {
			// Changed since the cache's read: Cluster API writes a booting
			// Machine every few seconds, and a lagging cache shows an
			// older version. Decided again on a live read; a Machine
			// marked, rebound, deleted or with a registered Node since
			// is left alone (model seed 117 with the over-creating
			// MachineSet: the successor raised a replica beside the
			// Machine it could have adopted).
			fresh := &clusterv1.Machine{}
			if gerr := p.hub.GetAPIReader().Get(ctx, client.ObjectKeyFromObject(m), fresh); gerr == nil &&
				fresh.UID == m.UID && fresh.Annotations[v1alpha1.NodeClaimAnnotation] == gone && p.adoptable(ctx, fresh) {
				m = fresh
				continue
			}
		}
		// Changed since the read (marked, bound, deleted): the claim
		// reserves as usual.
		log.FromContext(ctx).V(1).Info("not adopting Machine", "Machine", client.ObjectKeyFromObject(m), "NodeClaim", claim, "error", err.Error())
		return false, nil
	}
	p.recent.forget(gone)
	p.recent.add(claim, m, p.now())
	p.goneSeen.forget(gone)
	log.FromContext(ctx).Info("adopted the Machine of a NodeClaim that went before it launched", "Machine", client.ObjectKeyFromObject(m), "NodeClaim", claim, "gone", gone)
	if p.Events != nil {
		p.Events.Eventf(m, corev1.EventTypeNormal, "Adopted", "NodeClaim %s went before this Machine launched: bound to NodeClaim %s, made for the same pods", gone, claim)
	}
	metrics.OrphansReleased.WithLabelValues("adopted").Inc()
	return true, nil
}
