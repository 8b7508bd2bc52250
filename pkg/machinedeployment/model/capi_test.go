package model

import (
	"context"
	"fmt"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinedeployment/mdutil"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The model's Cluster API: which MachineSet of a MachineDeployment gets
// which spec.replicas, and which Machines each MachineSet removes. The same
// functions drive the world (runMachineSets, one MachineDeployment pass per
// turn) and the invariant-1 check (capiExtraRemovals, on copies, no writes).
//
// It follows Cluster API v1.14.2 (core/reconcilers/machinedeployment: the
// rollout planner's reconcileNewMachineSet, reconcileOldMachineSetsOnDelete,
// reconcileOldMachineSetsRollingUpdate with scaleDownOldMSs and
// reconcileDeadlockBreaker; mdutil.NewMSNewReplicas; machineset: syncReplicas
// and status.replicas), with these simplifications, none of which changes
// which MachineSet loses a replica when the MachineDeployment's drop:
//   - With no old MachineSet holding replicas or Machines, the current one
//     takes the MachineDeployment's replicas at once (the model's MachineSet
//     before this file). Cluster API may hold a raise back while Machines
//     are being deleted (NewMSNewReplicas counts them); a delayed raise
//     removes nothing, and a lowering of a lone MachineSet is the same.
//   - Paused MachineDeployments (the proportional scale of sync) and
//     in-place updates (a feature gate, off by default) are not modelled.
//   - A MachineSet's status is always current: status.replicas counts its
//     Machines, deleting ones included (as Cluster API's setReplicas does),
//     available ones are those with a Node that are not being deleted
//     (Cluster API waits for the Node's Ready condition and minReadySeconds:
//     availability only paces a rolling update, it never picks the
//     MachineSet that loses a replica).
//   - An old MachineSet is deleted once it has no replicas and no Machines,
//     not only once the whole rollout is complete (it takes part in no
//     decision: every rule skips MachineSets with no replicas).
//   - A MachineSet removes its excess in the model's deletion order
//     (deleting, marked, without a Node, then by name); Cluster API's default
//     order is Random after the first two, which the model does not need.
//   - MachineDeployment annotations are not copied to the MachineSets, and
//     Machines are named <md>-m<n> as before, not <machineset>-<random>.

// capiMachine is a Machine as its MachineSet weighs it for removal; m is nil
// for a Machine the MachineSet may still create (the checks' worst case).
type capiMachine struct {
	m        *clusterv1.Machine
	name     string
	deleting bool
	marked   bool // the delete-machine annotation, whoever set it
	node     bool
}

// priority is the MachineSet's deletion order: deleting first, then marked,
// then without a Node, then the rest.
func (c *capiMachine) priority() int {
	switch {
	case c.deleting:
		return 4
	case c.marked:
		return 3
	case !c.node:
		return 2
	}
	return 1
}

// capiSet is one MachineSet as the model's Cluster API plans it.
type capiSet struct {
	ms       *clusterv1.MachineSet // nil: the current MachineSet Cluster API has not created yet
	name     string
	created  metav1.Time
	old      bool  // its template is not the MachineDeployment's
	spec     int32 // spec.replicas
	intent   *int32
	machines []*capiMachine // the Machines it controls, deleting ones included
}

func (s *capiSet) status() int32 { return int32(len(s.machines)) }

func (s *capiSet) available() int32 {
	var n int32
	for _, m := range s.machines {
		if m.node && !m.deleting {
			n++
		}
	}
	return n
}

// want is the replicas the pass means to give the MachineSet so far.
func (s *capiSet) want() int32 {
	if s.intent != nil {
		return *s.intent
	}
	return s.spec
}

func (s *capiSet) clone() *capiSet {
	c := *s
	c.intent = nil
	c.machines = make([]*capiMachine, len(s.machines))
	for i, m := range s.machines {
		cm := *m
		c.machines[i] = &cm
	}
	return &c
}

// canCreate: under OnDelete Cluster API disables Machine creation on old
// MachineSets (the disable-machine-create annotation).
func canCreate(md *clusterv1.MachineDeployment, s *capiSet) bool {
	return !s.old || md.Spec.Rollout.Strategy.Type != clusterv1.OnDeleteMachineDeploymentStrategyType
}

// excess is the Machines the MachineSet removes for its spec.replicas, in
// its deletion order (deleting ones included: it counts them).
func (s *capiSet) excess() []*capiMachine {
	n := int(s.status() - s.spec)
	if n <= 0 {
		return nil
	}
	order := append([]*capiMachine(nil), s.machines...)
	sort.SliceStable(order, func(i, j int) bool {
		if order[i].priority() != order[j].priority() {
			return order[i].priority() > order[j].priority()
		}
		return order[i].name < order[j].name
	})
	return order[:n]
}

// capiPass is one reconcile of Cluster API's MachineDeployment controller:
// it sets each MachineSet's spec.replicas and reports whether any changed.
// sets holds exactly one current MachineSet (not old).
func capiPass(md *clusterv1.MachineDeployment, sets []*capiSet) bool {
	r := ptr.Deref(md.Spec.Replicas, 0)
	var cur *capiSet
	var old []*capiSet
	active := false
	for _, s := range sets {
		s.intent = nil
		if !s.old {
			cur = s
			continue
		}
		old = append(old, s)
		active = active || s.spec > 0 || s.status() > 0
	}
	if !active {
		cur.intent = ptr.To(r) // one MachineSet: it follows the MachineDeployment
	} else {
		// The oldest old MachineSet first (creation, then name).
		sort.SliceStable(old, func(i, j int) bool {
			if old[i].created.Equal(&old[j].created) {
				return old[i].name < old[j].name
			}
			return old[i].created.Before(&old[j].created)
		})
		capiScaleCurrent(md, cur, sets)
		if md.Spec.Rollout.Strategy.Type == clusterv1.OnDeleteMachineDeploymentStrategyType {
			capiOnDeleteOld(md, cur, old)
		} else {
			capiRollingOld(md, cur, old, sets)
			capiBreakDeadlock(cur, old, sets)
		}
	}
	changed := false
	for _, s := range sets {
		if s.intent != nil && *s.intent != s.spec {
			s.spec = *s.intent
			changed = true
		}
		s.intent = nil
	}
	return changed
}

// capiScaleCurrent: the current MachineSet comes down to the
// MachineDeployment's replicas at once when above them; below, it grows
// only while all MachineSets together (each at the larger of its replicas
// and its Machines) stay within the replicas (OnDelete) or the replicas
// plus maxSurge (RollingUpdate), never past the MachineDeployment's.
func capiScaleCurrent(md *clusterv1.MachineDeployment, cur *capiSet, sets []*capiSet) {
	r := ptr.Deref(md.Spec.Replicas, 0)
	switch {
	case cur.spec == r:
		return
	case cur.spec > r:
		cur.intent = ptr.To(r)
		return
	}
	var total int32
	for _, s := range sets {
		total += max(s.spec, s.status())
	}
	limit := r
	if md.Spec.Rollout.Strategy.Type != clusterv1.OnDeleteMachineDeploymentStrategyType {
		limit += mdutil.MaxSurge(*md)
	}
	if total >= limit {
		return
	}
	if grown := cur.spec + min(limit-total, r-cur.spec); grown != cur.spec {
		cur.intent = ptr.To(grown)
	}
}

// capiOnDeleteOld: old MachineSets whose replicas exceed their Machines are
// first brought down to them (they may not create under OnDelete); what the
// MachineSets still hold beyond the MachineDeployment's replicas then comes
// off the oldest old MachineSet first. As in Cluster API, that second step
// counts down from spec.replicas, not from the first step's result.
func capiOnDeleteOld(md *clusterv1.MachineDeployment, cur *capiSet, old []*capiSet) {
	var oldSum int32
	for _, s := range old {
		oldSum += s.spec
	}
	if oldSum == 0 {
		return
	}
	over := max(oldSum+cur.want()-ptr.Deref(md.Spec.Replicas, 0), 0)
	for _, s := range old {
		if s.spec <= 0 {
			continue
		}
		if gap := s.spec - s.status(); gap > 0 {
			s.intent = ptr.To(max(s.spec-gap, 0))
			over -= gap
		}
	}
	for _, s := range old {
		if over <= 0 {
			break
		}
		w := s.want()
		if w <= 0 {
			continue
		}
		cut := min(w, over)
		s.intent = ptr.To(max(s.spec-cut, 0))
		over -= cut
	}
}

// capiRollingOld: old MachineSets come down, the oldest first, only as far
// as keeping the MachineDeployment's replicas minus maxUnavailable
// available allows, assuming the worst (an available Machine goes), and
// less while the current MachineSet has unavailable replicas; Machines
// already unavailable go first.
func capiRollingOld(md *clusterv1.MachineDeployment, cur *capiSet, old, sets []*capiSet) {
	var oldSum, totalSpec, totalAvail, pending int32
	for _, s := range old {
		oldSum += s.spec
	}
	if oldSum == 0 {
		return
	}
	minAvail := max(ptr.Deref(md.Spec.Replicas, 0)-mdutil.MaxUnavailable(*md), 0)
	for _, s := range sets {
		totalSpec += s.spec
		totalAvail += s.available()
		w := s.spec
		if s.intent != nil {
			w = min(w, *s.intent)
		}
		if w < s.status() {
			pending += s.status() - w
		}
	}
	curUnavail := max(cur.spec-cur.available(), 0)
	total := max(totalSpec-pending-minAvail-curUnavail, 0)
	if total <= 0 {
		return
	}
	total, totalAvail = capiScaleDownOld(old, total, totalAvail, minAvail, true)
	capiScaleDownOld(old, total, totalAvail, minAvail, false)
}

func capiScaleDownOld(old []*capiSet, total, totalAvail, minAvail int32, unavailableOnly bool) (int32, int32) {
	for _, s := range old {
		if total <= 0 {
			break
		}
		reps := s.want()
		if reps <= 0 {
			continue
		}
		most := reps
		if unavailableOnly {
			most = max(reps-s.available(), 0)
		}
		cut := min(most, total)
		if cut == 0 {
			continue
		}
		if s.available() > 0 {
			gone := max(s.status()-max(reps-cut, 0), 0) // existing Machines the cut removes
			if gone > 0 {
				if totalAvail-minAvail < gone {
					floor := min(s.status()-max(totalAvail-minAvail, 0), reps)
					cut = max(reps-floor, 0)
					gone = max(s.status()-floor, 0)
				}
				totalAvail -= min(s.available(), gone)
			}
		}
		if cut > 0 {
			s.intent = ptr.To(max(reps-cut, 0))
			total = max(total-cut, 0)
		}
	}
	return total, totalAvail
}

// capiBreakDeadlock: a rolling update that cannot go on because old
// MachineSets hold unavailable Machines (and nothing else moves) takes one
// replica off the oldest such MachineSet.
func capiBreakDeadlock(cur *capiSet, old, sets []*capiSet) {
	var oldStatus, oldAvail int32
	for _, s := range old {
		oldStatus += s.status()
		oldAvail += s.available()
	}
	if oldStatus == 0 || oldStatus == oldAvail {
		return
	}
	for _, s := range sets {
		if s.spec != s.status() || s.intent != nil {
			return
		}
	}
	if cur.available() != cur.status() {
		return
	}
	for _, s := range old {
		if s.available() == s.status() || s.spec == 0 {
			continue
		}
		s.intent = ptr.To(max(s.spec-1, 0))
		return
	}
}

// machineSetsOf lists a MachineDeployment's MachineSets (the label Cluster
// API sets, controlled by the MachineDeployment), oldest first.
func (w *world) machineSetsOf(md *clusterv1.MachineDeployment) []*clusterv1.MachineSet {
	list := &clusterv1.MachineSetList{}
	w.must(w.hub.API.List(context.Background(), list, client.InNamespace(md.Namespace),
		client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}))
	var out []*clusterv1.MachineSet
	for i := range list.Items {
		if metav1.IsControlledBy(&list.Items[i], md) {
			out = append(out, &list.Items[i])
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].CreationTimestamp.Equal(&out[j].CreationTimestamp) {
			return out[i].Name < out[j].Name
		}
		return out[i].CreationTimestamp.Before(&out[j].CreationTimestamp)
	})
	return out
}

// capiState is the model's Cluster API's view of a MachineDeployment: its
// MachineSets (with a not yet created current one when none matches the
// template: Cluster API makes it on its next pass, with no replicas) and
// their Machines.
func capiState(md *clusterv1.MachineDeployment, msets []*clusterv1.MachineSet, machines []clusterv1.Machine, now metav1.Time) []*capiSet {
	cur, _, _, _ := mdutil.FindNewAndOldMachineSets(md, append([]*clusterv1.MachineSet(nil), msets...), now)
	byName := map[string]*capiSet{}
	var sets []*capiSet
	for _, ms := range msets {
		s := &capiSet{ms: ms, name: ms.Name, created: ms.CreationTimestamp, old: cur == nil || ms.Name != cur.Name, spec: ptr.Deref(ms.Spec.Replicas, 0)}
		byName[ms.Name] = s
		sets = append(sets, s)
	}
	if cur == nil {
		sets = append(sets, &capiSet{name: "(" + md.Name + "'s next MachineSet)", created: now})
	}
	for i := range machines {
		m := &machines[i]
		ref := metav1.GetControllerOf(m)
		if ref == nil || ref.Kind != "MachineSet" || byName[ref.Name] == nil {
			continue
		}
		s := byName[ref.Name]
		s.machines = append(s.machines, &capiMachine{m: m, name: m.Name, deleting: !m.DeletionTimestamp.IsZero(), marked: marked(m), node: m.Status.NodeRef.IsDefined()})
	}
	return sets
}

// capiSimulate plays Cluster API on sets (copies) at md's replicas until
// it settles: MachineDeployment passes, each followed by the MachineSets
// removing their excess (marked deleting here: they stay counted, as
// deleting Machines are). It returns the Machines removed and from which
// MachineSet.
func capiSimulate(md *clusterv1.MachineDeployment, sets []*capiSet) map[*capiMachine]string {
	removed := map[*capiMachine]string{}
	for range 8 {
		changed := capiPass(md, sets)
		for _, s := range sets {
			for _, m := range s.excess() {
				if !m.deleting {
					m.deleting = true
					removed[m] = s.name
					changed = true
				}
			}
		}
		if !changed {
			break
		}
	}
	return removed
}

// unmarkedOf counts the removed Machines that were neither deleting nor
// marked by the provider (Machines the MachineSet may still create count:
// no one marked them).
func unmarkedOf(removed map[*capiMachine]string) (int, []string) {
	n := 0
	var names []string
	for m, set := range removed {
		switch {
		case m.m == nil:
			n++
			names = append(names, set+": a Machine it may still create")
		case !ourMark(m.m):
			n++
			names = append(names, set+": "+m.name)
		}
	}
	sort.Strings(names)
	return n, names
}

func cloneSets(sets []*capiSet) []*capiSet {
	out := make([]*capiSet, len(sets))
	for i, s := range sets {
		out[i] = s.clone()
	}
	return out
}

func withReplicas(md *clusterv1.MachineDeployment, r int32) *clusterv1.MachineDeployment {
	c := md.DeepCopy()
	c.Spec.Replicas = ptr.To(r)
	return c
}

// capiExtraRemovals is invariant 1 by simulation: how many more Machines
// that are neither deleting nor marked by the provider the model's Cluster
// API removes once it sees md (as before the write, at r0 replicas) at x
// replicas than at r0, and which. Cluster API may see the write at once,
// from the MachineSets as they are (their replicas possibly behind an
// earlier change), or after it has caught up with r0 (each MachineSet
// allowed to create having made the Machines up to its replicas: they are
// unmarked), or in between: each of these states is tried and the worst
// counts. With one MachineSet this is max(Machines, r0) - x removed,
// deleting and then marked ones first.
func capiExtraRemovals(md *clusterv1.MachineDeployment, msets []*clusterv1.MachineSet, machines []clusterv1.Machine, x int32, now metav1.Time) (int, string) {
	r0 := ptr.Deref(md.Spec.Replicas, 0)
	state := capiState(md, msets, machines, now)
	worst, which := 0, ""
	for gen := 0; gen < 4; gen++ {
		base, _ := unmarkedOf(capiSimulate(md, cloneSets(state)))
		at, names := unmarkedOf(capiSimulate(withReplicas(md, x), cloneSets(state)))
		if at-base > worst {
			worst = at - base
			which = fmt.Sprintf("%s (after %d Cluster API pass(es) at %d; MachineSets %s)", strings.Join(names, ", "), gen, r0, describeSets(state))
		}
		// Cluster API catches up with r0 before it sees the write: the
		// MachineSets take their replicas, remove their excess, and make
		// the Machines they may.
		next := cloneSets(state)
		progressed := len(capiSimulate(md, next)) > 0
		grew := false
		for _, s := range next {
			if !canCreate(md, s) {
				continue
			}
			for n := s.status(); n < s.spec; n++ {
				s.machines = append(s.machines, &capiMachine{name: "~"})
				grew = true
			}
		}
		if !grew && !progressed && sameSpecs(state, next) {
			break
		}
		state = next
	}
	return worst, which
}

func sameSpecs(a, b []*capiSet) bool {
	for i := range a {
		if a[i].spec != b[i].spec {
			return false
		}
	}
	return true
}

func describeSets(sets []*capiSet) string {
	var parts []string
	for _, s := range sets {
		kind := "current"
		if s.old {
			kind = "old"
		}
		parts = append(parts, fmt.Sprintf("%s %s %d/%d", s.name, kind, s.spec, s.status()))
	}
	return strings.Join(parts, ", ")
}

// machineSetName is the controlling MachineSet of a Machine ("" if none).
func machineSetName(m *clusterv1.Machine) string {
	if ref := metav1.GetControllerOf(m); ref != nil && ref.Kind == "MachineSet" {
		return ref.Name
	}
	return ""
}
