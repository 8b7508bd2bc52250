package instancetype

import (
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/scheduling"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// OfferingKey names one offering of one instance type.
type OfferingKey struct {
	InstanceType, Zone, CapacityType string
}

// Set is the instance types a NodeClass resolves to, and for each offering
// the objects it can launch from, best first.
type Set struct {
	InstanceTypes []*cloudprovider.InstanceType
	Origins       map[OfferingKey][]Source
	// Problems are reasons some sources were skipped or merged, each naming the object.
	Problems []string
	// Estimated names the instance types with an offering priced by estimate
	// because no price annotation gave one, sorted.
	Estimated []string
}

// Source returns the set's source of an origin (with the NodeClass's kubelet
// settings the set was resolved with), if the origin offers in the set.
func (s *Set) Source(origin types.NamespacedName) (Source, bool) {
	for _, origins := range s.Origins {
		for _, src := range origins {
			if src.Origin == origin {
				return src, true
			}
		}
	}
	return Source{}, false
}

// Build merges sources into instance types: sources that yield the same
// instance type become one instance type with one offering per zone and
// capacity type. Unusable sources are reported, not returned. An instance
// type with an offering in no particular zone gets a price record (see
// Zones) in each zone of knownZones and of the sources that no offering of
// its own covers.
func Build(sources []Source, knownZones ...string) *Set {
	set := &Set{Origins: map[OfferingKey][]Source{}}
	byName := map[string][]Source{}
	allZones := append([]string(nil), knownZones...)
	for _, s := range sources {
		if s.Err == nil && s.Zone != "" {
			allZones = appendUnique(allZones, s.Zone)
		}
	}
	sort.Strings(allZones)
	for _, s := range sources {
		set.Problems = append(set.Problems, s.Problems...)
		if s.Err != nil {
			set.Problems = append(set.Problems, s.Err.Error())
			continue
		}
		byName[s.Name] = append(byName[s.Name], s)
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		group := byName[name]
		sort.Slice(group, func(i, j int) bool { return originLess(group[i].Origin, group[j].Origin) })
		it, kept := buildOne(name, group, set, allZones)
		set.InstanceTypes = append(set.InstanceTypes, it)
		estimated := false
		for _, s := range kept {
			k := OfferingKey{InstanceType: name, Zone: s.Zone, CapacityType: s.CapacityType}
			set.Origins[k] = append(set.Origins[k], s)
			estimated = estimated || s.PriceEstimated
		}
		if estimated {
			set.Estimated = append(set.Estimated, name)
		}
	}
	for k, origins := range set.Origins {
		sort.SliceStable(origins, func(i, j int) bool {
			if origins[i].Available != origins[j].Available {
				return origins[i].Available
			}
			return origins[i].Price < origins[j].Price
		})
		set.Origins[k] = origins
	}
	return set
}

func buildOne(name string, group []Source, set *Set, allZones []string) (*cloudprovider.InstanceType, []Source) {
	first := group[0]
	kept := []Source{first}
	reservations := map[string]Source{} // zone -> the reserved source kept
	if first.isReserved() {
		reservations[first.Zone] = first
	}
	for _, s := range group[1:] {
		if r, ok := reservations[s.Zone]; ok && s.isReserved() && r.ReservationID != s.ReservationID {
			// One reserved offering per type and zone: an offering key has no
			// reservation ID.
			set.Problems = append(set.Problems, fmt.Sprintf("%s names capacity reservation %s, %s names %s for %s in %q too: it is skipped; use one reservation per instance type and zone",
				s.Origin, s.ReservationID, r.Origin, r.ReservationID, name, s.Zone))
			continue
		}
		if !equality.Semantic.DeepEqual(s.Capacity, first.Capacity) || !equality.Semantic.DeepEqual(s.Allocatable, first.Allocatable) || s.Arch != first.Arch || s.OS != first.OS {
			set.Problems = append(set.Problems, fmt.Sprintf(
				"MachineDeployment %s yields instance type %s with a different capacity, allocatable (kubelet settings) or architecture than %s: it is skipped; give it a distinct instance type",
				s.Origin, name, first.Origin))
			continue
		}
		kept = append(kept, s)
		if s.isReserved() {
			reservations[s.Zone] = s
		}
	}

	offers := map[OfferingKey]*offer{}
	var zones, capacityTypes []string
	zoneless := false // a source in no particular zone: the type may land in any
	for _, s := range kept {
		zoneless = zoneless || s.Zone == ""
		k := OfferingKey{InstanceType: name, Zone: s.Zone, CapacityType: s.CapacityType}
		o, ok := offers[k]
		if !ok {
			o = &offer{price: s.Price, available: s.Available, reservationID: s.ReservationID, capacity: s.ReservationCapacity}
			offers[k] = o
			if s.Zone != "" {
				zones = appendUnique(zones, s.Zone)
			}
			capacityTypes = appendUnique(capacityTypes, s.CapacityType)
			continue
		}
		// Several origins for one offering: it is as cheap as the cheapest
		// and available while any can grow.
		if s.Available && (!o.available || s.Price < o.price) {
			o.price = s.Price
		}
		o.available = o.available || s.Available
		o.capacity = min(o.capacity, s.ReservationCapacity)
	}

	reqs := []*scheduling.Requirement{
		scheduling.NewRequirement(corev1.LabelInstanceTypeStable, corev1.NodeSelectorOpIn, name),
		scheduling.NewRequirement(corev1.LabelArchStable, corev1.NodeSelectorOpIn, first.Arch),
		scheduling.NewRequirement(corev1.LabelOSStable, corev1.NodeSelectorOpIn, first.OS),
		scheduling.NewRequirement(karpv1.CapacityTypeLabelKey, corev1.NodeSelectorOpIn, capacityTypes...),
	}
	// A zone requirement only when every offering has a zone: an offering
	// without one lands wherever the infrastructure puts it, and the Node
	// tells the zone once it registers.
	if len(zones) > 0 && !zoneless {
		reqs = append(reqs, scheduling.NewRequirement(corev1.LabelTopologyZone, corev1.NodeSelectorOpIn, zones...))
	}
	common := commonLabels(kept)
	for k, v := range common {
		switch k {
		case corev1.LabelInstanceTypeStable, corev1.LabelArchStable, corev1.LabelOSStable, corev1.LabelTopologyZone, karpv1.CapacityTypeLabelKey:
			continue
		}
		reqs = append(reqs, scheduling.NewRequirement(k, corev1.NodeSelectorOpIn, v))
	}
	reqs = append(reqs, instanceLabelRequirements(first.InstanceLabels, keySet(common))...)

	keys := make([]OfferingKey, 0, len(offers))
	for k := range offers {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Zone != keys[j].Zone {
			return keys[i].Zone < keys[j].Zone
		}
		return keys[i].CapacityType < keys[j].CapacityType
	})
	offerings := make(cloudprovider.Offerings, 0, len(keys))
	for _, k := range keys {
		o := offers[k]
		oreqs := []*scheduling.Requirement{scheduling.NewRequirement(karpv1.CapacityTypeLabelKey, corev1.NodeSelectorOpIn, k.CapacityType)}
		if k.Zone != "" {
			oreqs = append(oreqs, scheduling.NewRequirement(corev1.LabelTopologyZone, corev1.NodeSelectorOpIn, k.Zone))
		} else {
			// An offering in no particular zone lands wherever the
			// infrastructure puts it, so it must not satisfy a NodeClaim that
			// asks for a zone (topology spread, a zonal volume, a NodePool's
			// zones): DoesNotExist is compatible only with NodeClaims that do
			// not constrain the zone, and makes core's Offering.Zone() ""
			// instead of a random value (its cost tracking keys on it).
			oreqs = append(oreqs, scheduling.NewRequirement(corev1.LabelTopologyZone, corev1.NodeSelectorOpDoesNotExist))
		}
		capacity := 0
		if k.CapacityType == karpv1.CapacityTypeReserved {
			oreqs = append(oreqs, scheduling.NewRequirement(v1alpha1.LabelCapacityReservationID, corev1.NodeSelectorOpIn, o.reservationID))
			capacity = o.capacity
		} else {
			oreqs = append(oreqs, scheduling.NewRequirement(v1alpha1.LabelCapacityReservationID, corev1.NodeSelectorOpDoesNotExist))
		}
		offerings = append(offerings, &cloudprovider.Offering{
			Requirements:        scheduling.NewRequirements(oreqs...),
			Price:               o.price,
			Available:           o.available,
			ReservationCapacity: capacity,
		})
	}
	offerings = append(offerings, priceRecords(name, offers, allZones)...)
	return &cloudprovider.InstanceType{
		Name:         name,
		Requirements: scheduling.NewRequirements(reqs...),
		Offerings:    offerings,
		Capacity:     first.Capacity.DeepCopy(),
		Overhead:     first.Kubelet.Overhead(first.Capacity),
	}, kept
}

// priceRecords are the offerings of an instance type's zoneless offerings
// in the zones no offering of its own covers: the zoneless price, zone and
// capacity type pinned, never available (see Zones).
func priceRecords(name string, offers map[OfferingKey]*offer, zones []string) cloudprovider.Offerings {
	var out cloudprovider.Offerings
	for _, ct := range []string{karpv1.CapacityTypeOnDemand, karpv1.CapacityTypeSpot} {
		zoneless, ok := offers[OfferingKey{InstanceType: name, CapacityType: ct}]
		if !ok {
			continue
		}
		for _, z := range zones {
			if _, covered := offers[OfferingKey{InstanceType: name, Zone: z, CapacityType: ct}]; covered {
				continue
			}
			out = append(out, &cloudprovider.Offering{
				Requirements: scheduling.NewRequirements(
					scheduling.NewRequirement(karpv1.CapacityTypeLabelKey, corev1.NodeSelectorOpIn, ct),
					scheduling.NewRequirement(corev1.LabelTopologyZone, corev1.NodeSelectorOpIn, z),
					scheduling.NewRequirement(v1alpha1.LabelCapacityReservationID, corev1.NodeSelectorOpDoesNotExist),
				),
				Price:     zoneless.price,
				Available: false,
			})
		}
	}
	return out
}

// offer is one offering of an instance type as Build merges its sources.
type offer struct {
	price     float64
	available bool
	// reservationID and capacity of a reserved offering.
	reservationID string
	capacity      int
}

// commonLabels are the node labels every source of a group agrees on.
func commonLabels(group []Source) map[string]string {
	out := map[string]string{}
	for k, v := range group[0].NodeLabels {
		out[k] = v
	}
	for _, s := range group[1:] {
		for k, v := range out {
			if s.NodeLabels[k] != v {
				delete(out, k)
			}
		}
	}
	return out
}

func appendUnique(list []string, v string) []string {
	for _, x := range list {
		if x == v {
			return list
		}
	}
	return append(list, v)
}

func originLess(a, b types.NamespacedName) bool {
	if a.Namespace != b.Namespace {
		return a.Namespace < b.Namespace
	}
	return a.Name < b.Name
}
