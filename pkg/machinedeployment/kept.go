package machinedeployment

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

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
