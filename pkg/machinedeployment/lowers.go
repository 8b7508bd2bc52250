package machinedeployment

import (
	"errors"
	"fmt"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinedeployment/mdutil"
)

// errLowersElsewhere: during a rollout Cluster API takes a lowering from
// another MachineSet than the marked Machine's (an OnDelete rollout lowers
// its oldest out-of-date MachineSet first), or from one that cannot be told
// (a rolling update spreads it), so the mark cannot cover it. Release
// removes the Machine directly then (design doc, "Release").
var errLowersElsewhere = fmt.Errorf("%w: during a rollout Cluster API would take it from another MachineSet", errNotCovered)

// lowering is what Cluster API does with a lowering of a MachineDeployment's
// spec.replicas: which MachineSet loses the replicas and which Machines it
// removes them from (design doc, "Which MachineSet loses a replica").
type lowering struct {
	// set is the MachineSet that loses the replicas; "" when at most one
	// MachineSet holds Machines or replicas (then machines are all the
	// MachineDeployment's, as the MachineSet sees them).
	set string
	// machines are the Machines that MachineSet removes from.
	machines []*clusterv1.Machine
	// base is the replicas that MachineSet has before the write (the
	// MachineDeployment's when set is ""); room is how many it can lose
	// before Cluster API would take from another.
	base, room int32
	// err is why Cluster API's choice cannot be told now (a rollout that
	// is not OnDelete, a paused MachineDeployment, MachineSets that have
	// not caught up): every lowering is refused while it is set.
	err error
}

// lowers tells which MachineSet Cluster API lowers when the
// MachineDeployment's spec.replicas drop, from the MachineDeployment, its
// MachineSets and its Machines. sets nil means the MachineSets were not
// read: the Machines alone tell whether one MachineSet holds them.
func lowers(md *clusterv1.MachineDeployment, sets []*clusterv1.MachineSet, machines []*clusterv1.Machine) lowering {
	r0 := ptr.Deref(md.Spec.Replicas, 0)
	bySet := map[string][]*clusterv1.Machine{}
	for _, m := range machines {
		bySet[machineSetOf(m)] = append(bySet[machineSetOf(m)], m)
	}
	active := map[string]bool{}
	for name := range bySet {
		active[name] = true
	}
	for _, ms := range sets {
		if ptr.Deref(ms.Spec.Replicas, 0) > 0 {
			active[ms.Name] = true
		}
	}
	if len(active) <= 1 {
		if sets != nil && len(active) == 1 && !ptr.Deref(md.Spec.Paused, false) && md.Spec.Rollout.Strategy.Type != clusterv1.OnDeleteMachineDeploymentStrategyType {
			// The template changed and Cluster API has not made the new
			// MachineSet yet: its first pass makes it with a surge Machine
			// before it sees the lowering, which it may then take off that
			// Machine rather than the marked one.
			if newMS, _, _, _ := mdutil.FindNewAndOldMachineSets(md, sets, metav1.Now()); newMS == nil {
				return lowering{err: fmt.Errorf("%w: a rolling update is about to start (no MachineSet has the MachineDeployment's template yet)", errLowersElsewhere)}
			}
		}
		return lowering{machines: machines, base: r0, room: r0}
	}
	switch {
	case sets == nil:
		return lowering{err: errors.New("the MachineDeployment's Machines belong to several MachineSets")}
	case ptr.Deref(md.Spec.Paused, false):
		return lowering{err: fmt.Errorf("%w: the MachineDeployment is paused with several MachineSets", errLowersElsewhere)}
	case md.Spec.Rollout.Strategy.Type != clusterv1.OnDeleteMachineDeploymentStrategyType:
		return lowering{err: fmt.Errorf("%w: a rolling update is in progress", errLowersElsewhere)}
	}
	for name := range bySet {
		if name == "" || !containsSet(sets, name) {
			return lowering{err: fmt.Errorf("%w: a Machine of the MachineDeployment belongs to no MachineSet the provider reads", errLowersElsewhere)}
		}
	}
	// OnDelete (reconcileOldMachineSetsOnDelete): out-of-date MachineSets
	// whose replicas exceed their Machines are first lowered to them; the
	// rest of a lowering comes off the oldest out-of-date MachineSet with
	// replicas, then the next; the up-to-date one only once they have none.
	_, old, _, _ := mdutil.FindNewAndOldMachineSets(md, sets, metav1.Now())
	var sum int32
	for _, ms := range sets {
		sum += ptr.Deref(ms.Spec.Replicas, 0)
	}
	if sum != r0 {
		return lowering{err: fmt.Errorf("%w: the MachineSets' replicas (%d) have not caught up with the MachineDeployment's (%d)", errLowersElsewhere, sum, r0)}
	}
	sort.Sort(mdutil.MachineSetsByCreationTimestamp(old))
	for _, ms := range old {
		spec := ptr.Deref(ms.Spec.Replicas, 0)
		if spec > 0 && (spec != ptr.Deref(ms.Status.Replicas, 0) || spec != int32(len(bySet[ms.Name]))) {
			return lowering{err: fmt.Errorf("%w: MachineSet %s has %d replicas and %d Machines", errLowersElsewhere, ms.Name, spec, len(bySet[ms.Name]))}
		}
	}
	for _, ms := range old {
		if spec := ptr.Deref(ms.Spec.Replicas, 0); spec > 0 {
			return lowering{set: ms.Name, machines: bySet[ms.Name], base: spec, room: spec}
		}
	}
	// No out-of-date MachineSet has replicas: the up-to-date one is lowered
	// (its Machines are the only live ones with replicas behind them).
	for _, ms := range sets {
		if !isOld(ms, old) && ptr.Deref(ms.Spec.Replicas, 0) > 0 {
			spec := ptr.Deref(ms.Spec.Replicas, 0)
			return lowering{set: ms.Name, machines: bySet[ms.Name], base: spec, room: spec}
		}
	}
	return lowering{err: fmt.Errorf("%w: no MachineSet has replicas to lose", errLowersElsewhere)}
}

// covers reports whether a lowering taken off l.set can be covered by a
// mark on m: m belongs to that MachineSet (always, with one MachineSet).
func (l lowering) covers(m *clusterv1.Machine) bool {
	return l.err == nil && (l.set == "" || m == nil || machineSetOf(m) == l.set)
}

func containsSet(sets []*clusterv1.MachineSet, name string) bool {
	for _, ms := range sets {
		if ms.Name == name {
			return true
		}
	}
	return false
}

func isOld(ms *clusterv1.MachineSet, old []*clusterv1.MachineSet) bool {
	for _, o := range old {
		if o.Name == ms.Name {
			return true
		}
	}
	return false
}
