package machinedeployment

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/failpoint"
)

// Release starts the removal of the Machine bound to a NodeClaim that is
// being deleted: it marks the Machine and lowers its replica (the writer
// lowers only what is still owed, so core's retries of Delete are safe).
// With no Machine (m nil) nothing is left of the claim's but a
// reservation, which is free now (the controller gives it back or the next
// NodeClaim takes it): ErrMachineGone.
func (p *Provider) Release(ctx context.Context, claim string, m *clusterv1.Machine) error {
	if m == nil {
		return ErrMachineGone
	}
	if !m.DeletionTimestamp.IsZero() {
		return nil // going: core calls again until it is gone
	}
	if m.Annotations[v1alpha1.NodeClaimAnnotation] != claim || !p.machines.Owned(m) {
		return fmt.Errorf("Machine %s/%s is not bound to NodeClaim %s: not touching it", m.Namespace, m.Name, claim)
	}
	return p.release(ctx, claim, m, "deleted")
}

// release marks the Machine bound to claim and lowers its replica; why
// ends the sentence "NodeClaim <claim> …" in the mark, log and event.
func (p *Provider) release(ctx context.Context, claim string, m *clusterv1.Machine, why string) error {
	mdName := m.Labels[clusterv1.MachineDeploymentNameLabel]
	if mdName == "" {
		return fmt.Errorf("Machine %s/%s has no label %s: cannot tell its MachineDeployment", m.Namespace, m.Name, clusterv1.MachineDeploymentNameLabel)
	}
	first, err := p.mark(ctx, m, releaseMark(claim, why))
	if errors.Is(err, ErrMachineGone) {
		return nil
	} else if err != nil {
		return err
	}
	key := types.NamespacedName{Namespace: m.Namespace, Name: mdName}
	in := &intent{kind: intentLower, claim: claim, machine: m, why: why}
	if err := p.writer.do(ctx, key, in); err != nil {
		return err
	}
	failpoint.Crash(StepRelease)
	switch {
	case in.atMin:
		// Replicas stay at min-size: the MachineSet would keep the marked
		// Machine, so the provider removes exactly it and the MachineSet
		// makes a Machine for whoever set the minimum.
		if err := p.deleteMachine(ctx, m); err != nil && !errors.Is(err, ErrMachineGone) {
			return err
		}
	case deletesDirectly(in.err) && why != whyFailedLaunch:
		// A rollout: Cluster API would take a lowering from another
		// MachineSet than this Machine's (OnDelete: its oldest
		// out-of-date one; a rolling update spreads it), maybe until the
		// rollout ends. The provider removes exactly this Machine; its
		// replica stays Karpenter's (reclaimed for the NodeClaim, then
		// taken by the next one or given back once the rollout lets it),
		// and the NodeClaim's termination completes. A failed launch's
		// Machine, which costs nothing, waits for its lowering instead.
		if err := p.deleteMachine(ctx, m); err != nil && !errors.Is(err, ErrMachineGone) {
			return err
		}
	case in.err != nil && isNotCovered(in.err) && why == whyFailedLaunch:
		// The Machine is marked (no longer the claim's) and its replica
		// owed: the controller's pass lowers it once covered. The launch
		// fails over now; an error here would have core retry Create on
		// this MachineDeployment, raising a replica per retry.
	case in.err != nil && isNotCovered(in.err):
		return fmt.Errorf("releasing Machine %s/%s of NodeClaim %s: %w", m.Namespace, m.Name, claim, in.err)
	case in.err != nil:
		// The MachineDeployment's records cannot be read: the release
		// still completes, the Machine goes directly (the MachineSet
		// makes a Machine no one owns, reported) until they are fixed.
		if err := p.deleteMachine(ctx, m); err != nil && !errors.Is(err, ErrMachineGone) {
			return err
		}
	}
	if first && p.Events != nil {
		p.Events.Event(m, corev1.EventTypeNormal, "Released", fmt.Sprintf("NodeClaim %s %s: marked for deletion and its replica given back", claim, why))
	}
	return nil
}

// mark sets the provider's mark on the Machine, so that its MachineSet
// removes it first when replicas go down. first is false when it carried
// the provider's mark already. A Machine gone is ErrMachineGone.
func (p *Provider) mark(ctx context.Context, m *clusterv1.Machine, value string) (first bool, err error) {
	if markedByUs(m) {
		return false, nil
	}
	for attempt := 0; ; attempt++ {
		cur := m.DeepCopy()
		patch := client.MergeFromWithOptions(m.DeepCopy(), client.MergeFromWithOptimisticLock{})
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		cur.Annotations[clusterv1.DeleteMachineAnnotation] = value
		err := p.hub.GetClient().Patch(ctx, cur, patch, client.FieldOwner(FieldManager))
		switch {
		case err == nil:
			p.barrier.record("Machine", cur)
			*m = *cur
			failpoint.Crash(StepMark)
			return true, nil
		case apierrors.IsNotFound(err):
			return false, ErrMachineGone
		case !apierrors.IsConflict(err) || attempt >= 3:
			return false, fmt.Errorf("marking Machine %s/%s for deletion: %w", m.Namespace, m.Name, err)
		}
		live := &clusterv1.Machine{}
		if err := p.hub.GetAPIReader().Get(ctx, client.ObjectKeyFromObject(m), live); err != nil {
			if apierrors.IsNotFound(err) {
				return false, ErrMachineGone
			}
			return false, fmt.Errorf("reading Machine %s/%s: %w", m.Namespace, m.Name, err)
		}
		if live.UID != m.UID || !live.DeletionTimestamp.IsZero() {
			return false, ErrMachineGone
		}
		if markedByUs(live) {
			*m = *live
			return false, nil
		}
		if live.Annotations[v1alpha1.NodeClaimAnnotation] != m.Annotations[v1alpha1.NodeClaimAnnotation] {
			return false, fmt.Errorf("Machine %s/%s changed hands since it was read: not marking it", m.Namespace, m.Name)
		}
		*m = *live
	}
}

// markUnbound marks an unbound Machine to give a reservation back with. The
// patch tests that it is still unbound, unmarked and not being deleted.
func (p *Provider) markUnbound(ctx context.Context, m *clusterv1.Machine, value string) error {
	ops := []jsonPatchOp{
		{Op: "test", Path: "/metadata/uid", Value: string(m.UID)},
		{Op: "test", Path: "/metadata/deletionTimestamp", Value: nil},
	}
	if len(m.Annotations) == 0 {
		ops = append(ops, jsonPatchOp{Op: "test", Path: "/metadata/annotations", Value: nil},
			jsonPatchOp{Op: "add", Path: "/metadata/annotations", Value: map[string]string{clusterv1.DeleteMachineAnnotation: value}})
	} else {
		ops = append(ops,
			jsonPatchOp{Op: "test", Path: "/metadata/annotations/" + pointer(v1alpha1.NodeClaimAnnotation), Value: nil},
			jsonPatchOp{Op: "test", Path: "/metadata/annotations/" + pointer(clusterv1.DeleteMachineAnnotation), Value: nil},
			jsonPatchOp{Op: "add", Path: "/metadata/annotations/" + pointer(clusterv1.DeleteMachineAnnotation), Value: value})
	}
	patch, err := rawJSONPatch(ops)
	if err != nil {
		return err
	}
	cur := m.DeepCopy()
	if err := p.hub.GetClient().Patch(ctx, cur, patch, client.FieldOwner(FieldManager)); err != nil {
		if apierrors.IsNotFound(err) || changedSinceRead(err) {
			return errMachineChanged
		}
		return fmt.Errorf("marking Machine %s/%s for deletion: %w", m.Namespace, m.Name, err)
	}
	p.barrier.record("Machine", cur)
	*m = *cur
	return nil
}

// unmark takes the provider's mark off a Machine (one a give-back did not
// need). A Machine changed or gone since keeps its state.
func (p *Provider) unmark(ctx context.Context, m *clusterv1.Machine) error {
	if !markedByUs(m) {
		return nil
	}
	cur := m.DeepCopy()
	patch := client.MergeFromWithOptions(m.DeepCopy(), client.MergeFromWithOptimisticLock{})
	delete(cur.Annotations, clusterv1.DeleteMachineAnnotation)
	switch err := p.hub.GetClient().Patch(ctx, cur, patch, client.FieldOwner(FieldManager)); {
	case err == nil:
		p.barrier.record("Machine", cur)
		return nil
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return nil
	default:
		return fmt.Errorf("unmarking Machine %s/%s: %w", m.Namespace, m.Name, err)
	}
}

// errMachineChanged: the Machine changed since the read a decision about it
// was made on; the next pass decides on a fresh read.
var errMachineChanged = errors.New("machine changed since it was read")

// deleteMachine deletes exactly this Machine (UID precondition).
func (p *Provider) deleteMachine(ctx context.Context, m *clusterv1.Machine) error {
	err := p.hub.GetClient().Delete(ctx, m, client.Preconditions{UID: &m.UID})
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return ErrMachineGone
	default:
		return fmt.Errorf("deleting Machine %s/%s: %w", m.Namespace, m.Name, err)
	}
}
