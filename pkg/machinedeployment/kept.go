package machinedeployment

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
)

// keptGrace is how long a released Machine may stay while its MachineSet
// has as many Machines as replicas: the MachineSet removes a marked Machine
// within a reconcile (a second or two) when it has one too many.
const keptGrace = 10 * time.Second

// deleteKeptReleased deletes released Machines that the MachineSet keeps.
// A release marks the Machine and gives its replica back, so that the
// MachineSet removes exactly it; but when someone else raises the replicas
// at the same time, the MachineSet has as many Machines as replicas and
// keeps the marked one for ever: its NodeClaim would never finish
// terminating (core waits for the Machine to go) and the instance would
// keep running. Once the MachineSet has settled (as many live Machines as
// replicas) and the mark is older than keptGrace, the provider deletes the
// Machine itself, as it does at min-size. That changes no count: the
// replica is no longer the released Machine's, and the MachineSet makes a
// Machine for it.
//
// The raise that cancelled the release out is often Karpenter's own (a
// NodeClaim raised for on the same MachineDeployment as another is
// released): keptGrace is well within OrphanGrace so that the MachineSet's
// new Machine serves that raise before it counts as stranded (found by the
// soak: the stranded raise was dropped and raised again, and the kept
// Machine's replica passed to no one). It returns when to look again.
func (c *Controller) deleteKeptReleased(ctx context.Context, md *clusterv1.MachineDeployment, use usage, now time.Time) (time.Duration, error) {
	if len(use.released) == 0 {
		return 0, nil
	}
	replicas := int32(0)
	if md.Spec.Replicas != nil {
		replicas = *md.Spec.Replicas
	}
	if replicas != use.live {
		return keptGrace, nil // the MachineSet has yet to act: it may remove them itself
	}
	var wait time.Duration
	for _, m := range use.released {
		marked, err := time.Parse(time.RFC3339, m.Annotations[clusterv1.DeleteMachineAnnotation])
		if err != nil {
			continue // not our mark (someone else's value): not ours to act on
		}
		if age := now.Sub(marked); age < keptGrace {
			if wait == 0 || keptGrace-age < wait {
				wait = keptGrace - age
			}
			continue
		}
		if err := c.provider.deleteMachine(ctx, m); errors.Is(err, ErrMachineGone) {
			continue
		} else if err != nil {
			return 0, err
		}
		log.FromContext(ctx).Info("deleting a released Machine its MachineSet keeps", "Machine", client.ObjectKeyFromObject(m), "MachineDeployment", client.ObjectKeyFromObject(md))
		c.event(c.hubEvents, m, corev1.EventTypeNormal, "ReleasedMachineDeleted",
			fmt.Sprintf("released since %s, but kept by its MachineSet (its replicas were raised by someone else meanwhile): deleted directly", marked.Format(time.RFC3339)))
		metrics.OrphansReleased.WithLabelValues("kept").Inc()
	}
	return wait, nil
}

// keptSince remembers, per MachineDeployment and Machine (by UID), since
// when a Machine has been seen kept. Memory only: a restart starts the wait
// over, which only delays.
type keptSince struct {
	mu    sync.Mutex
	since map[types.NamespacedName]map[types.UID]time.Time
}

// observe records the Machines of one MachineDeployment seen kept now and
// returns since when each has been; a Machine not seen kept is forgotten.
func (k *keptSince) observe(md types.NamespacedName, kept []*clusterv1.Machine, now time.Time) map[types.UID]time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.since == nil {
		k.since = map[types.NamespacedName]map[types.UID]time.Time{}
	}
	prev := k.since[md]
	next := make(map[types.UID]time.Time, len(kept))
	for _, m := range kept {
		if at, ok := prev[m.UID]; ok {
			next[m.UID] = at
		} else {
			next[m.UID] = now
		}
	}
	if len(next) == 0 {
		delete(k.since, md)
	} else {
		k.since[md] = next
	}
	return next
}

// deleteKeptSpares deletes spare-marked Machines that the MachineSet keeps.
// A give-back marks an unbound Machine and lowers the replicas in one step,
// so that the MachineSet removes exactly it; when a raise follows before the
// MachineSet acts (often Karpenter's own: the NodeClaim whose reservation
// was given back raises again), the MachineSet has as many Machines as
// replicas and keeps the marked one for ever, in the place of the raise's
// Machine. The stranded reservation waits for it (stranded), so it must
// go: once the MachineSet has been seen settled with it for keptGrace, the
// provider deletes it (live read: still unbound and marked by this
// provider; resourceVersion precondition). No count changes: its replica
// was given back, and the MachineSet makes a Machine for the raise.
func (c *Controller) deleteKeptSpares(ctx context.Context, md *clusterv1.MachineDeployment, use usage, now time.Time) (time.Duration, error) {
	replicas := int32(0)
	if md.Spec.Replicas != nil {
		replicas = *md.Spec.Replicas
	}
	var kept []*clusterv1.Machine
	if replicas == use.live { // otherwise the MachineSet may still remove them
		kept = use.spares
	}
	since := c.keptSpares.observe(client.ObjectKeyFromObject(md), kept, now)
	var wait time.Duration
	for _, m := range kept {
		if age := now.Sub(since[m.UID]); age < keptGrace {
			if wait == 0 || keptGrace-age < wait {
				wait = keptGrace - age
			}
			continue
		}
		if ok, err := c.provider.keptByMachineSet(ctx, md); err != nil || !ok {
			return keptGrace, err // the MachineSet has one too many: it removes a marked Machine itself
		}
		live := &clusterv1.Machine{}
		if err := c.provider.hub.GetAPIReader().Get(ctx, client.ObjectKeyFromObject(m), live); apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return 0, fmt.Errorf("reading Machine %s/%s: %w", m.Namespace, m.Name, err)
		}
		if live.UID != m.UID || !live.DeletionTimestamp.IsZero() || !spareMarked(live) || live.Annotations[v1alpha1.NodeClaimAnnotation] != "" {
			continue
		}
		err := c.provider.hub.GetClient().Delete(ctx, live, client.Preconditions{UID: &live.UID, ResourceVersion: &live.ResourceVersion})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			continue // gone or changed since the read: decided again next pass
		} else if err != nil {
			return 0, fmt.Errorf("deleting Machine %s/%s: %w", m.Namespace, m.Name, err)
		}
		log.FromContext(ctx).Info("deleting a Machine given back that its MachineSet keeps", "Machine", client.ObjectKeyFromObject(m), "MachineDeployment", client.ObjectKeyFromObject(md))
		c.event(c.hubEvents, m, corev1.EventTypeNormal, "SpareMachineDeleted",
			"its replica was given back, but its MachineSet kept it (the replicas were raised again meanwhile): deleted directly")
		metrics.OrphansReleased.WithLabelValues("kept").Inc()
	}
	return wait, nil
}

// keptByMachineSet reports, on a live read, whether the MachineDeployment's
// MachineSets have no more live Machines than replicas: they remove no
// Machine then, marked or not.
func (p *Provider) keptByMachineSet(ctx context.Context, md *clusterv1.MachineDeployment) (bool, error) {
	key := client.ObjectKeyFromObject(md)
	live := &clusterv1.MachineDeployment{}
	if err := p.hub.GetAPIReader().Get(ctx, key, live); err != nil {
		return false, fmt.Errorf("reading MachineDeployment %s: %w", key, err)
	}
	machines := &clusterv1.MachineList{}
	if err := p.hub.GetAPIReader().List(ctx, machines, client.InNamespace(md.Namespace),
		client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
		return false, fmt.Errorf("listing Machines of MachineDeployment %s: %w", key, err)
	}
	n := int32(0)
	for i := range machines.Items {
		if machines.Items[i].DeletionTimestamp.IsZero() {
			n++
		}
	}
	return n <= ptr.Deref(live.Spec.Replicas, 0), nil
}
