package model

import (
	"context"

	"fmt"
	corev1 "k8s.io/api/core/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
)

// checks are the invariants of docs/design/machinedeployment-binding.md,
// checked on every write the provider makes, against the API server's
// state just before it. There is no exemption: a write that breaks one is
// a failure whatever led to it.
func (w *world) checks() interceptor.Funcs {
	return interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*clusterv1.MachineList); ok && !w.acting.Load() && w.listing.Load() == 0 {
				w.liveMachineLists.Add(1)
			}
			return c.List(ctx, list, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if md, ok := obj.(*clusterv1.MachineDeployment); ok && !w.acting.Load() {
				w.failf("MachineDeployment %s written with a whole-object Update: the provider patches only what it changes", md.Name)
			}
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if w.acting.Load() {
				return c.Patch(ctx, obj, patch, opts...)
			}
			switch o := obj.(type) {
			case *clusterv1.MachineDeployment:
				old := &clusterv1.MachineDeployment{}
				if err := c.Get(ctx, client.ObjectKeyFromObject(o), old); err == nil {
					if err := c.Patch(ctx, obj, patch, opts...); err != nil {
						return err
					}
					w.mdWrites.Add(1)
					now := &clusterv1.MachineDeployment{}
					_ = c.Get(ctx, client.ObjectKeyFromObject(o), now)
					w.checkReplicas(old, now)
					return nil
				}
			case *clusterv1.Machine:
				old := &clusterv1.Machine{}
				if err := c.Get(ctx, client.ObjectKeyFromObject(o), old); err == nil {
					if err := c.Patch(ctx, obj, patch, opts...); err != nil {
						return err // refused: nothing happened
					}
					now := &clusterv1.Machine{}
					_ = c.Get(ctx, client.ObjectKeyFromObject(o), now)
					w.checkMachinePatch(ctx, c, old, now)
					return nil
				}
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if m, ok := obj.(*clusterv1.Machine); ok && !w.acting.Load() {
				old := &clusterv1.Machine{}
				if err := c.Get(ctx, client.ObjectKeyFromObject(m), old); err == nil {
					if err := c.Delete(ctx, obj, opts...); err != nil {
						return err
					}
					w.checkRemoval(old, "deleted")
					return nil
				}
			}
			return c.Delete(ctx, obj, opts...)
		},
	}
}

// ourMark reports whether a Machine carries the provider's mark.
func ourMark(m *clusterv1.Machine) bool {
	return strings.HasPrefix(m.Annotations[clusterv1.DeleteMachineAnnotation], "karpenter-clusterapi")
}

// mdMachines lists a MachineDeployment's Machines in the API server.
func (w *world) mdMachines(md string) []clusterv1.Machine {
	var out []clusterv1.Machine
	for _, m := range w.machines() {
		if m.Labels[clusterv1.MachineDeploymentNameLabel] == md {
			out = append(out, m)
		}
	}
	return out
}

// stamp resolves a reservation's stamp on the MachineDeployment as read.
func stamp(md *clusterv1.MachineDeployment, claim string) (time.Time, bool) {
	pending, _ := hub.PendingNodeClaims(md)
	at, ok := pending[claim]
	if !ok {
		return time.Time{}, false
	}
	if at.IsZero() {
		for _, e := range md.ManagedFields {
			if e.Manager == machinedeployment.FieldManager && e.Time != nil {
				return e.Time.Time, true
			}
		}
		return time.Time{}, false
	}
	return at, true
}

// checkReplicas: invariants 1, 3 and 4 on a MachineDeployment write.
func (w *world) checkReplicas(old, md *clusterv1.MachineDeployment) {
	before, after := ptr.Deref(old.Spec.Replicas, 0), ptr.Deref(md.Spec.Replicas, 0)
	oldOwned, hadOwned := owned(old)
	newOwned, _ := owned(md)
	if w.trace != nil {
		w.trace(fmt.Sprintf("  write %s: replicas %d->%d owned %d->%d pending %s -> %s", md.Name, before, after, oldOwned, newOwned,
			old.Annotations[hub.PendingNodeClaimsAnnotation], md.Annotations[hub.PendingNodeClaimsAnnotation]))
	}
	machines := w.mdMachines(md.Name)
	// Invariant 1: no unmarked removal, by simulation: the model's Cluster
	// API (capi_test.go) at the replicas before and after the write, from
	// the MachineSets and Machines as they are (its own turn has not come
	// yet). With one MachineSet it removes max(Machines, replicas it may
	// still create up to) - replicas, deleting and marked ones first.
	var all, deleting, marks int32
	for _, m := range machines {
		all++
		switch {
		case !m.DeletionTimestamp.IsZero():
			deleting++
		case ourMark(&m):
			marks++
		}
	}
	if after < before {
		if more, which := capiExtraRemovals(old, w.machineSetsOf(old), machines, after, metav1.NewTime(w.now)); more > 0 {
			w.failf("MachineDeployment %s lowered %d->%d with %d Machines, %d deleting and %d marked by the provider: Cluster API removes %d unmarked Machine(s) more: %s",
				md.Name, before, after, all, deleting, marks, more, which)
		}
	}
	// Invariant 3.
	if after > before {
		if maxSize, ok := bound32(md, instancetype.MaxSizeAnnotation); ok && after > maxSize {
			w.failf("MachineDeployment %s raised to %d replicas, past max-size %d", md.Name, after, maxSize)
		}
	}
	minSize, hasMin := bound32(md, instancetype.MinSizeAnnotation)
	if after < before && hasMin && after < minSize {
		w.failf("MachineDeployment %s lowered to %d replicas, below min-size %d", md.Name, after, minSize)
	}
	if !hadOwned {
		oldOwned = newOwned - (after - before) // a first count: others' share is what was there
	}
	othersBefore, othersAfter := before-oldOwned, after-newOwned
	// Invariant 4: others' replicas never decrease...
	if othersAfter < othersBefore {
		w.failf("MachineDeployment %s: others' replicas went from %d to %d by the provider's write (replicas %d->%d, owned %d->%d)",
			md.Name, othersBefore, othersAfter, before, after, oldOwned, newOwned)
	}
	// ...and increase only to make up a deficit, at min-size, or for a
	// reservation no Machine can serve (its MachineSet settled with no
	// Machine made since the raise: the MachineSet removed Karpenter's
	// Machine for someone else's lowering).
	if gain := othersAfter - othersBefore; gain > 0 {
		allowed := max(oldOwned-before, 0)
		if hasMin && after <= minSize {
			allowed = gain
		}
		oldPending, _ := hub.PendingNodeClaims(old)
		newPending, _ := hub.PendingNodeClaims(md)
		settled := all == before && deleting == 0
		for claim := range oldPending {
			if _, kept := newPending[claim]; kept || !settled {
				continue
			}
			at, ok := stamp(old, claim)
			if !ok {
				continue
			}
			eligible := false
			for _, m := range machines {
				if m.DeletionTimestamp.IsZero() && !marked(&m) && bound(&m) == "" && !m.CreationTimestamp.Time.Before(at) && !m.Status.NodeRef.IsDefined() {
					eligible = true
				}
			}
			if !eligible {
				allowed++
			}
		}
		// Replicas Karpenter counted that no bound Machine, reservation
		// or provider mark accounts for (a bound Machine deleted unseen).
		var boundLive int32
		for _, m := range machines {
			if m.DeletionTimestamp.IsZero() && bound(&m) != "" && !ourMark(&m) {
				boundLive++
			}
		}
		if settled && marks == 0 {
			open := int32(0)
			for claim := range oldPending {
				at, _ := stamp(old, claim)
				used := false
				for _, m := range machines {
					if bound(&m) == claim && m.DeletionTimestamp.IsZero() && !m.CreationTimestamp.Time.Before(at.Truncate(time.Second)) {
						used = true
					}
				}
				if !used {
					open++
				}
			}
			allowed += max(0, oldOwned-boundLive-open)
		}
		if gain > allowed {
			w.failf("MachineDeployment %s: the provider's write gave others %d replica(s), %d allowed (deficit, min-size, stranded) (replicas %d->%d, owned %d->%d, pending %s -> %s)",
				md.Name, gain, allowed, before, after, oldOwned, newOwned, old.Annotations[hub.PendingNodeClaimsAnnotation], md.Annotations[hub.PendingNodeClaimsAnnotation])
		}
	}
}

// checkMachinePatch: invariants 2 and 5 on a binding or a mark.
func (w *world) checkMachinePatch(ctx context.Context, c client.Reader, old, m *clusterv1.Machine) {
	if w.trace != nil && (bound(old) != bound(m) || marked(old) != marked(m)) {
		w.trace(fmt.Sprintf("  patch %s: bound %q -> %q, marked %q -> %q", m.Name, bound(old), bound(m),
			old.Annotations[clusterv1.DeleteMachineAnnotation], m.Annotations[clusterv1.DeleteMachineAnnotation]))
	}
	md := &clusterv1.MachineDeployment{}
	mdErr := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: m.Labels[clusterv1.MachineDeploymentNameLabel]}, md)
	if claim := bound(m); claim != "" && bound(old) != claim {
		st, lives := w.claims[claim]
		switch {
		case bound(old) != "":
			w.failf("Machine %s moved from NodeClaim %s to %s", m.Name, bound(old), claim)
		case w.userOwned[m.Name]:
			w.failf("Machine %s of someone else (long running, with a Node) bound to %s", m.Name, claim)
		case old.Status.NodeRef.IsDefined() && w.nodeRegistered(old.Status.NodeRef.Name):
			w.failf("Machine %s bound to %s while its Node was registered (someone's workloads may run there)", m.Name, claim)
		case !old.DeletionTimestamp.IsZero() || marked(old):
			w.failf("Machine %s bound to %s while being deleted or marked", m.Name, claim)
		case !lives || st.deleting || st.launched:
			w.failf("Machine %s bound to NodeClaim %s, which is gone, terminating or launched", m.Name, claim)
		}
		if mdErr == nil {
			at, ok := stamp(md, claim)
			if !ok {
				w.failf("Machine %s bound to %s, which has no reservation on %s", m.Name, claim, md.Name)
			} else if old.CreationTimestamp.Time.Before(at) {
				w.failf("Machine %s (created %s) bound to %s reserved at %s: it existed before the raise", m.Name, old.CreationTimestamp.UTC(), claim, at)
			}
		}
		for _, other := range w.machines() {
			if other.Name != m.Name && bound(&other) == claim && other.DeletionTimestamp.IsZero() && !ourMark(&other) {
				w.failf("NodeClaim %s bound to Machine %s while bound to %s", claim, m.Name, other.Name)
			}
		}
	}
	if ourMark(m) && !ourMark(old) {
		if bound(old) == "" {
			// Marked to give a reservation back with: made for it.
			key := strings.TrimPrefix(m.Annotations[clusterv1.DeleteMachineAnnotation], "karpenter-clusterapi: replica of NodeClaim ")
			key, _, _ = strings.Cut(key, " ")
			if mdErr == nil {
				if at, ok := stamp(md, key); !ok {
					w.failf("unbound Machine %s marked for reservation %q, which %s does not hold", m.Name, key, md.Name)
				} else if old.CreationTimestamp.Time.Before(at) {
					w.failf("unbound Machine %s (created %s) marked to give back %s's reservation of %s: it existed before the raise", m.Name, old.CreationTimestamp.UTC(), key, at)
				}
			}
			if w.userOwned[m.Name] {
				w.failf("Machine %s of someone else marked", m.Name)
			}
		} else {
			w.checkRemoval(old, "marked")
		}
	}
}

// checkRemoval: the provider marks or deletes a bound Machine only when its
// NodeClaim is being deleted or gone, or its launch failed; it deletes an
// unbound one only when it carries the provider's own mark (a give-back's,
// checked when it was set: made for the reservation it gave back).
func (w *world) checkRemoval(old *clusterv1.Machine, what string) {
	claim := bound(old)
	if claim == "" {
		if what == "deleted" && !ourMark(old) {
			w.failf("unbound Machine %s deleted by the provider without its mark", old.Name)
		}
		return
	}
	if c, ok := w.claims[claim]; ok && !c.deleting && !w.infraFailed(old) {
		w.failf("Machine %s %s while its NodeClaim %s lives and its launch did not fail", old.Name, what, claim)
	}
}

func bound32(md *clusterv1.MachineDeployment, key string) (int32, bool) {
	v, ok := md.Annotations[key]
	if !ok || v == "" {
		return 0, false
	}
	n := int32(0)
	for _, ch := range v {
		if ch < '0' || ch > '9' {
			return 0, false
		}
		n = n*10 + int32(ch-'0')
	}
	return n, true
}

// checkState: invariant 5 on the state after a step.
func (w *world) checkState() {
	byClaim := map[string]string{}
	for _, m := range w.machines() {
		claim := bound(&m)
		if claim == "" || !m.DeletionTimestamp.IsZero() || ourMark(&m) {
			continue
		}
		if other, ok := byClaim[claim]; ok {
			w.failf("NodeClaim %s bound to two live Machines: %s and %s", claim, other, m.Name)
		}
		byClaim[claim] = m.Name
	}
}

// checkSettled: invariant 6, once nothing changes.
func (w *world) checkSettled() {
	for _, name := range w.claimNames() {
		if c := w.claims[name]; !c.launched && !c.deleting {
			w.failf("settled: NodeClaim %s never launched", name)
		}
	}
	for _, name := range w.mds {
		md := w.md(name)
		pending, _ := hub.PendingNodeClaims(md)
		n, ok := owned(md)
		var boundMachines, live int32
		for _, m := range w.mdMachines(name) {
			if !m.DeletionTimestamp.IsZero() {
				continue
			}
			live++
			if bound(&m) != "" && !ourMark(&m) {
				boundMachines++
			}
		}
		r := ptr.Deref(md.Spec.Replicas, 0)
		if !ok || n != boundMachines || len(pending) > 0 {
			if w.trace != nil {
				for _, m := range w.mdMachines(name) {
					w.trace(fmt.Sprintf("  machine %s claim=%q mark=%q deleting=%v node=%v created=%s", m.Name, bound(&m),
						m.Annotations[clusterv1.DeleteMachineAnnotation], !m.DeletionTimestamp.IsZero(), m.Status.NodeRef.IsDefined(), m.CreationTimestamp.UTC().Format(time.TimeOnly)))
				}
				w.trace("  " + name + " replicas " + fmt.Sprint(r) + " annotations " + fmt.Sprint(md.Annotations))
			}
			w.failf("settled: MachineDeployment %s owns %d (%v) replicas, %d bound Machines and %d reservations %v", name, n, ok, boundMachines, len(pending), pending)
		}
		if r != live {
			w.failf("settled: MachineDeployment %s has %d replicas and %d live Machines", name, r, live)
		}
	}
}

// held lists a MachineDeployment's reservations whose NodeClaim is gone:
// the replicas kept for the next NodeClaim.
func (w *world) held(md *clusterv1.MachineDeployment) map[string]time.Time {
	pending, _ := hub.PendingNodeClaims(md)
	out := map[string]time.Time{}
	for claim, at := range pending {
		if _, lives := w.claims[claim]; !lives {
			out[claim] = at
		}
	}
	return out
}

// nodeRegistered reports whether a Node is registered (or gone): it may run
// someone's workloads.
func (w *world) nodeRegistered(name string) bool {
	node := &corev1.Node{}
	if err := w.spoke.Get(context.Background(), types.NamespacedName{Name: name}, node); err != nil {
		return true
	}
	_, ok := node.Labels[karpv1.NodeRegisteredLabelKey]
	return ok || len(node.Spec.Taints) == 0
}
