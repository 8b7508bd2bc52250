package machinedeployment

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/failpoint"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
)

// Release starts the removal of the Machine bound to a NodeClaim: it marks
// the Machine for deletion and lowers its MachineDeployment's replicas
// (batched). m is the claim's Machine (hub.Lookup.Find), or nil when none
// exists; then a replica raised for the claim is given back and
// ErrMachineGone returned.
func (p *Provider) Release(ctx context.Context, claim string, m *clusterv1.Machine) error {
	if m == nil {
		// The cache may not show a binding this process made lately: the
		// replica is then the bound Machine's, released with it.
		recent, err := p.recentlyBound(ctx, claim)
		if err != nil {
			return err
		}
		m = recent
	}
	if m == nil {
		// No Machine: give back a replica raised for the claim, if any.
		if err := p.giveBack(ctx, claim); err != nil {
			return err
		}
		return ErrMachineGone
	}
	if !m.DeletionTimestamp.IsZero() {
		return nil
	}
	if m.Annotations[v1alpha1.NodeClaimAnnotation] != claim || !p.machines.Owned(m) {
		return fmt.Errorf("Machine %s/%s is not bound to NodeClaim %s: not touching it", m.Namespace, m.Name, claim)
	}
	mdName := m.Labels[clusterv1.MachineDeploymentNameLabel]
	if mdName == "" {
		return fmt.Errorf("Machine %s/%s has no label %s: cannot tell its MachineDeployment", m.Namespace, m.Name, clusterv1.MachineDeploymentNameLabel)
	}
	_, wasMarked := m.Annotations[clusterv1.DeleteMachineAnnotation]
	if err := p.markForDeletion(ctx, m); errors.Is(err, errMachineDeleting) {
		return nil
	} else if err != nil {
		return err
	}
	key := types.NamespacedName{Namespace: m.Namespace, Name: mdName}
	release := releaseOp(m, claim)
	if err := p.scaler.Apply(ctx, key, release); err != nil {
		return err
	}
	failpoint.Crash(StepRelease)
	if atMin, err := p.keptAtMinSize(ctx, key, m, release); err != nil {
		return err
	} else if atMin {
		// Replicas stay at min-size: the MachineSet would not remove the
		// marked Machine, so the provider removes exactly it; the
		// MachineSet replaces it with an unbound Machine.
		if err := p.deleteMachine(ctx, m); err != nil && !errors.Is(err, ErrMachineGone) {
			return err
		}
	}
	if p.Events != nil && !wasMarked { // once, not at every retry of core's Delete
		p.Events.Event(m, corev1.EventTypeNormal, "Released", "NodeClaim "+claim+" deleted: marked for deletion and its replica given back")
	}
	return nil
}

// releaseOp gives back the replica of Machine m bound to claim, and with it
// the claim's reservation if it is the one m was made for (see opRelease).
func releaseOp(m *clusterv1.Machine, claim string) *op {
	return &op{kind: opRelease, name: m.Name, claim: claim, since: m.CreationTimestamp.Add(bindSkew)}
}

// errMachineDeleting: the Machine is being deleted already (a live read).
var errMachineDeleting = errors.New("machine is being deleted")

// markForDeletion annotates the Machine so that its MachineSet deletes it
// first when replicas go down. A Machine the cache shows marked already is
// a retry, maybe on a cache that still shows a Machine that is gone or
// going: its released entry may be forgotten already, and giving its
// replica back again would take someone else's (found by the model test).
// Only a live read decides then: ErrMachineGone, errMachineDeleting or
// nil (marked and still there: the release op is idempotent).
func (p *Provider) markForDeletion(ctx context.Context, m *clusterv1.Machine) error {
	if _, ok := m.Annotations[clusterv1.DeleteMachineAnnotation]; ok {
		live := &clusterv1.Machine{}
		err := p.hub.GetAPIReader().Get(ctx, client.ObjectKeyFromObject(m), live)
		switch {
		case apierrors.IsNotFound(err) || (err == nil && live.UID != m.UID):
			return ErrMachineGone
		case err != nil:
			return fmt.Errorf("reading Machine %s/%s: %w", m.Namespace, m.Name, err)
		case !live.DeletionTimestamp.IsZero():
			return errMachineDeleting
		}
		return nil
	}
	patch := client.MergeFrom(m.DeepCopy())
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[clusterv1.DeleteMachineAnnotation] = p.now().UTC().Format(time.RFC3339)
	if err := p.hub.GetClient().Patch(ctx, m, patch); err != nil {
		if apierrors.IsNotFound(err) {
			return ErrMachineGone
		}
		return fmt.Errorf("marking Machine %s/%s for deletion: %w", m.Namespace, m.Name, err)
	}
	p.released.add(m.Namespace+"/"+m.Name, p.now())
	failpoint.Crash(StepMark)
	return nil
}

// giveBack lowers the replicas raised for a claim that has no Machine.
func (p *Provider) giveBack(ctx context.Context, claim string) error {
	mds := &clusterv1.MachineDeploymentList{}
	if err := p.hub.GetCache().List(ctx, mds, client.MatchingFields{hub.IndexMachineDeploymentPendingClaim: claim}); err != nil {
		return fmt.Errorf("looking up MachineDeployments pending for NodeClaim %s: %w", claim, err)
	}
	keys := map[types.NamespacedName]bool{}
	for i := range mds.Items {
		md := &mds.Items[i]
		keys[client.ObjectKeyFromObject(md)] = true
		if err := p.markGiveBackVictim(ctx, md, claim); err != nil {
			return err
		}
	}
	if v, ok := p.inflight.Load(claim); ok {
		keys[v.(types.NamespacedName)] = true
	}
	for key := range keys {
		if err := p.scaler.Apply(ctx, key, &op{kind: opGiveBack, name: claim}); err != nil {
			return fmt.Errorf("giving back the replica raised for NodeClaim %s on MachineDeployment %s: %w", claim, key, err)
		}
	}
	p.inflight.Delete(claim)
	return nil
}

// markGiveBackVictim marks the unbound Machine that the replica raised for
// claim on md may already have made, so that giving the replica back
// removes that Machine and not one the MachineSet picks by its own order.
func (p *Provider) markGiveBackVictim(ctx context.Context, md *clusterv1.MachineDeployment, claim string) error {
	pending, err := hub.PendingNodeClaims(md)
	if err != nil {
		return err
	}
	since, ok := pending[claim]
	if !ok {
		return nil
	}
	machines := &clusterv1.MachineList{}
	if err := p.hub.GetCache().List(ctx, machines, client.InNamespace(md.Namespace),
		client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
		return fmt.Errorf("listing Machines of MachineDeployment %s/%s: %w", md.Namespace, md.Name, err)
	}
	released, _ := hub.ReleasedMachines(md)
	sets, err := p.machineSets(ctx, md)
	if err != nil {
		return err
	}
	newest := ""
	if ms := newestOf(md, sets); ms != nil {
		newest = ms.Name
	}
	use := measure(machines.Items, pending, released, ptr.Deref(md.Spec.Replicas, 0), newest, func(m *clusterv1.Machine) bool { return p.recent.machineBound(m.Namespace + "/" + m.Name) })
	if victim := pickVictim(use.victims, nil, since.Add(-bindSkew)); victim != nil {
		return p.markSpare(ctx, victim)
	}
	return nil
}

// errMachineChanged: the Machine changed since the read a decision about it
// was made on; the next pass decides on a fresh read.
var errMachineChanged = errors.New("machine changed since it was read")

// unmarkSpare takes the spare mark off a Machine marked for a give-back
// that did not happen. A Machine changed or gone since keeps its state.
func (p *Provider) unmarkSpare(ctx context.Context, m *clusterv1.Machine) error {
	if !spareMarked(m) {
		return nil
	}
	patch := client.MergeFromWithOptions(m.DeepCopy(), client.MergeFromWithOptimisticLock{})
	delete(m.Annotations, clusterv1.DeleteMachineAnnotation)
	switch err := p.hub.GetClient().Patch(ctx, m, patch); {
	case err == nil, apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return nil
	default:
		return fmt.Errorf("unmarking Machine %s/%s: %w", m.Namespace, m.Name, err)
	}
}

// markSpare marks an unbound Machine for deletion, to give a replica back
// with it (see spareMark). The Machine was picked as unbound from the cache,
// which may lag behind a binding made since (by this process before a
// restart, whose bindings it does not remember): the patch carries the
// resourceVersion it was picked on, so a Machine bound since is never
// marked (found by the model test, seeds 25 and 37: a stranded reservation
// marked the Machine just bound to another live NodeClaim). A conflict
// gives errMachineChanged.
func (p *Provider) markSpare(ctx context.Context, m *clusterv1.Machine) error {
	if spareMarked(m) {
		return nil
	}
	patch := client.MergeFromWithOptions(m.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[clusterv1.DeleteMachineAnnotation] = spareMark
	switch err := p.hub.GetClient().Patch(ctx, m, patch); {
	case err == nil, apierrors.IsNotFound(err):
		return nil
	case apierrors.IsConflict(err):
		return fmt.Errorf("marking Machine %s/%s for deletion: %w: %w", m.Namespace, m.Name, errMachineChanged, err)
	default:
		return fmt.Errorf("marking Machine %s/%s for deletion: %w", m.Namespace, m.Name, err)
	}
}
