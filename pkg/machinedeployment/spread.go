package machinedeployment

import (
	"context"
	"hash/fnv"
	"sort"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

// spread picks which of the MachineDeployments of the cheapest price (ties,
// as launch.Choose returns them) a new reservation for the claim goes to.
//
// Each MachineDeployment's MachineSet creates the Machines of a raise one
// after another, and Cluster API reconciles several MachineSets at once
// (--machineset-concurrency): a burst spread over equal MachineDeployments
// is made by their MachineSets side by side instead of by one. The rule is
// derived from the objects and the claim's name alone, the same in every
// process and after a restart (nothing is remembered):
//
//  1. a MachineDeployment holding a reservation whose NodeClaim the spoke
//     cache no longer has, the first in name order: the reserving write
//     takes that reservation (and the Machine made for it) over instead
//     of raising;
//  2. otherwise the one the claim's name hashes to, over the
//     MachineDeployments in name order, so that a burst is shared evenly
//     and a claim always hashes to the same one.
//
// Rule 1 is a hint read from caches: the writer confirms a reservation is
// free before taking it over, and raises when it is not, as for any choice.
//
// Members whose MachineSet is behind (behind: a reservation waited
// MoveAfter with no Machine made for it) are left out while another is
// not: a launch there would wait, then move.
func (p *Provider) spread(ctx context.Context, claim string, ties []instancetype.Source) instancetype.Source {
	if len(ties) == 1 || p.hub == nil {
		return ties[0]
	}
	var keeping []instancetype.Source
	for _, src := range ties {
		if !p.behind(ctx, src.Origin) {
			keeping = append(keeping, src)
		}
	}
	if len(keeping) > 0 {
		ties = keeping
	}
	return spreadOver(ctx, claim, ties, p.hub.GetCache(), p.spoke)
}

// spreadOver is spread's rule, reading MachineDeployments from mds and
// NodeClaims from nodeClaims (both caches; nodeClaims may be nil).
func spreadOver(ctx context.Context, claim string, ties []instancetype.Source, mds, nodeClaims client.Reader) instancetype.Source {
	sorted := append([]instancetype.Source(nil), ties...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Origin.String() < sorted[j].Origin.String() })
	for _, src := range sorted {
		if holdsFree(ctx, mds, nodeClaims, src.Origin, claim) {
			return src
		}
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(claim))
	return sorted[h.Sum32()%uint32(len(sorted))]
}

// holdsFree reports whether the cached MachineDeployment holds a
// reservation of another NodeClaim that the spoke cache does not have. A
// read error or unreadable records say no.
func holdsFree(ctx context.Context, mds, nodeClaims client.Reader, key types.NamespacedName, claim string) bool {
	if nodeClaims == nil {
		return false
	}
	md := &clusterv1.MachineDeployment{}
	if err := mds.Get(ctx, key, md, client.UnsafeDisableDeepCopy); err != nil {
		return false
	}
	pending, err := hub.PendingNodeClaims(md)
	if err != nil {
		return false
	}
	for other := range pending {
		if other == claim {
			continue
		}
		nc := &karpv1.NodeClaim{}
		if err := nodeClaims.Get(ctx, types.NamespacedName{Name: other}, nc, client.UnsafeDisableDeepCopy); apierrors.IsNotFound(err) {
			return true
		}
	}
	return false
}
