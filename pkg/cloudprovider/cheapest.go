package cloudprovider

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/scheduling"
	"sigs.k8s.io/karpenter/pkg/utils/resources"

	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

// pricedInstanceTypes returns the instance types with the prices core
// schedules with (NodeOverlays applied), or the set's own when unavailable.
func (c *CloudProvider) pricedInstanceTypes(ctx context.Context, nodeClaim *karpv1.NodeClaim, set *instancetype.Set) []*cloudprovider.InstanceType {
	name := nodeClaim.Labels[karpv1.NodePoolLabelKey]
	if c.priced == nil || name == "" {
		return set.InstanceTypes
	}
	np := &karpv1.NodePool{}
	if err := c.kubeClient.Get(ctx, types.NamespacedName{Name: name}, np); err != nil {
		return set.InstanceTypes
	}
	its, err := c.priced.GetInstanceTypes(ctx, np)
	if err != nil || len(its) == 0 {
		return set.InstanceTypes
	}
	return its
}

// cheapest returns the objects of the set that launch the cheapest available
// offering compatible with the NodeClaim's requirements and resources, by
// the prices of its: every available source of every offering at that
// price, the one found first (by instance type, offering and origin order)
// first. Several are returned when offerings or origins tie; which of them
// launches is the mode's choice (launch.Choose). Never empty without an
// error.
func cheapest(set *instancetype.Set, its []*cloudprovider.InstanceType, nodeClaim *karpv1.NodeClaim) ([]instancetype.Source, error) {
	reqs := scheduling.NewNodeSelectorRequirementsWithMinValues(nodeClaim.Spec.Requirements...)
	var best []instancetype.Source
	bestPrice := 0.0
	var why []string
	for _, it := range its {
		if err := it.Requirements.Intersects(reqs); err != nil {
			if reqs.Get(corev1.LabelInstanceTypeStable).Has(it.Name) {
				why = append(why, fmt.Sprintf("%s: %v", it.Name, err))
			}
			continue
		}
		if !resources.Fits(nodeClaim.Spec.Resources.Requests, it.Allocatable()) {
			why = append(why, fmt.Sprintf("%s: requests %v do not fit allocatable %v", it.Name, resources.String(nodeClaim.Spec.Resources.Requests), resources.String(it.Allocatable())))
			continue
		}
		// Launchable: a full reservation is available but takes no launch.
		compatible := it.Offerings.Launchable().Compatible(reqs)
		if len(compatible) == 0 {
			why = append(why, fmt.Sprintf("%s: no available offering matches %s", it.Name, offeringRequirements(reqs)))
		}
		for _, of := range compatible {
			key := instancetype.KeyOf(it.Name, of)
			// The key's origins come cheapest first: the offering's price is
			// the first available one's, and only origins of its own price
			// tie with it.
			var first *instancetype.Source
			for _, src := range set.Origins[key] {
				if !src.Available || (first != nil && src.Price != first.Price) {
					continue
				}
				if first == nil {
					first = &src
				}
				switch {
				case best == nil || of.Price < bestPrice:
					best, bestPrice = []instancetype.Source{src}, of.Price
				case of.Price == bestPrice && !hasOrigin(best, src):
					best = append(best, src)
				}
			}
			if first == nil {
				why = append(why, fmt.Sprintf("%s in %s (%s): unavailable", it.Name, zoneName(key.Zone), key.CapacityType))
			}
		}
	}
	if best == nil {
		return nil, cloudprovider.NewInsufficientCapacityError(fmt.Errorf("NodeClaim %s: no available offering fits its requirements and resources: %s",
			nodeClaim.Name, truncate(strings.Join(why, "; "))))
	}
	return best, nil
}

// hasOrigin reports whether srcs launch from src's object already (an
// instance type listed twice, or a template serving several offerings).
func hasOrigin(srcs []instancetype.Source, src instancetype.Source) bool {
	for _, s := range srcs {
		if s.Origin == src.Origin && s.Zone == src.Zone && s.CapacityType == src.CapacityType && s.Name == src.Name {
			return true
		}
	}
	return false
}

// zoneName names a zone in messages; an offering without one is in no
// particular zone (the infrastructure chooses).
func zoneName(zone string) string {
	if zone == "" {
		return "no particular zone"
	}
	return "zone " + zone
}

func offeringRequirements(reqs scheduling.Requirements) string {
	var parts []string
	for _, key := range []string{corev1.LabelTopologyZone, karpv1.CapacityTypeLabelKey} {
		if reqs.Has(key) {
			parts = append(parts, reqs.Get(key).String())
		}
	}
	if len(parts) == 0 {
		return "any zone and capacity type"
	}
	return strings.Join(parts, ", ")
}
