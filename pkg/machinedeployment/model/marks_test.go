package model

import (
	"context"
	"math/rand"
	"strings"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// userMark is the value a person (or the migration from cluster-autoscaler,
// docs/migration-from-cluster-autoscaler.md) puts on a Machine to choose it
// for the next lowering: anything but the provider's own.
const userMark = "user: chosen for the next scale-down"

// markByHand is someone placing cluster.x-k8s.io/delete-machine on a live
// Machine (any: bound to a NodeClaim or not) and, half the time, lowering
// its MachineDeployment by one as the migration's step does; or taking a
// mark of theirs off again. It reports what it did ("" for nothing).
func (w *world) markByHand(rng *rand.Rand) string {
	var live []clusterv1.Machine
	for _, m := range w.machines() {
		if m.DeletionTimestamp.IsZero() {
			live = append(live, m)
		}
	}
	if len(live) == 0 {
		return ""
	}
	m := live[rng.Intn(len(live))]
	switch {
	case isUserMarked(&m):
		w.setUserMark(&m, false)
		return "someone takes their mark off " + m.Name
	case marked(&m):
		return ""
	}
	w.setUserMark(&m, true)
	what := "someone marks " + m.Name + " for deletion"
	if rng.Intn(2) == 0 {
		md := m.Labels[clusterv1.MachineDeploymentNameLabel]
		w.setReplicas(md, -1)
		what += " and lowers " + md + " by one"
	}
	return what
}

func isUserMarked(m *clusterv1.Machine) bool {
	return strings.HasPrefix(m.Annotations[clusterv1.DeleteMachineAnnotation], "user:")
}

func (w *world) setUserMark(m *clusterv1.Machine, on bool) {
	w.acting.Store(true)
	defer w.acting.Store(false)
	patch := client.MergeFrom(m.DeepCopy())
	if on {
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[clusterv1.DeleteMachineAnnotation] = userMark
	} else {
		delete(m.Annotations, clusterv1.DeleteMachineAnnotation)
	}
	w.must(client.IgnoreNotFound(w.hub.API.Patch(context.Background(), m, patch)))
}

// withdrawUserMarks is the end of the people's part before settling: a mark
// nobody lowers for is taken off (one that is lowered for goes with its
// Machine), so that settling is judged on the provider's own state.
func (w *world) withdrawUserMarks() {
	for _, m := range w.machines() {
		if m.DeletionTimestamp.IsZero() && isUserMarked(&m) {
			w.setUserMark(&m, false)
		}
	}
}
