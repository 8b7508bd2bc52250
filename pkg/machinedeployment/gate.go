package machinedeployment

import (
	"sort"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// removals is how a MachineSet picks the Machines it removes when its
// replicas drop, as Cluster API v1.14 does (core/reconcilers/machineset,
// deletion order): Machines being deleted first, then every Machine
// carrying cluster.x-k8s.io/delete-machine, whoever set it, all ranked
// alike and taken by name, then the rest (which of those does not matter
// here: none is the provider's to remove).
type removals struct {
	deleting int32
	// marks are the live marked Machines in the order the MachineSet
	// takes them; ours[i] says whether marks[i] is the provider's.
	ours []bool
	// all is every Machine the MachineSet counts, deleting ones included.
	all int32
}

// removalsOf reads the order from a MachineSet's Machines. extra names
// Machines the caller has just marked (the read may not show it yet).
func removalsOf(machines []*clusterv1.Machine, extra map[string]bool) removals {
	var rm removals
	var marked []*clusterv1.Machine
	for _, m := range machines {
		rm.all++
		switch {
		case !m.DeletionTimestamp.IsZero():
			rm.deleting++
		case isMarked(m) || extra[m.Name]:
			marked = append(marked, m)
		}
	}
	sort.Slice(marked, func(i, j int) bool { return marked[i].Name < marked[j].Name })
	for _, m := range marked {
		rm.ours = append(rm.ours, markedByUs(m) || extra[m.Name])
	}
	return rm
}

// uncovered is how many Machines that are neither deleting nor marked by
// the provider the MachineSet removes at base-d replicas, base being its
// replicas before the write: it may still create up to base Machines
// before it sees the write (those are unmarked).
func (rm removals) uncovered(base, d int32) int32 {
	n := max(rm.all, base) - (base - d) - rm.deleting
	var out int32
	for _, ours := range rm.ours {
		if n <= 0 {
			return out
		}
		if !ours {
			out++
		}
		n--
	}
	return out + max(0, n)
}

// othersFirst reports whether the lowering by d is refused only because of
// others' marks: counted as the provider's, they would cover it.
func (rm removals) othersFirst(base, d int32) bool {
	all := rm
	all.ours = make([]bool, len(rm.ours))
	for i := range all.ours {
		all.ours[i] = true
	}
	return rm.uncovered(base, d) > rm.uncovered(base, 0) && all.uncovered(base, d) <= all.uncovered(base, 0)
}
