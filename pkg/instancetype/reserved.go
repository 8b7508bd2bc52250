package instancetype

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/pricing"
)

// init tells Karpenter core which label carries the reservation of a
// reserved offering (and so of a NodeClaim launched into one): core's
// scheduler counts launches per reservation by it, and every non-reserved
// offering says DoesNotExist for it.
func init() {
	cloudprovider.ReservationIDLabel = v1alpha1.LabelCapacityReservationID
	cloudprovider.ReservedCapacityLabels.Insert(v1alpha1.LabelCapacityReservationID)
}

// ReservedPriceFraction is the default price of a reserved offering, as a
// fraction of the type's on-demand price: a reservation is paid for whether
// used or not, so using it costs next to nothing, and Karpenter prefers it;
// scaled by the on-demand price so that a larger reserved type still costs
// more than a smaller one.
const ReservedPriceFraction = 1e-6

// Reservation is a capacity reservation an infrastructure template launches
// into (CAPA: spec.template.spec.capacityReservationId, with or without
// marketType CapacityBlock).
type Reservation struct {
	ID string
	// Count is how many instances it holds: CAPA does not know, the user
	// says (annotation v1alpha1.ReservationCountAnnotation).
	Count int
	// Zone is the zone it lies in, "" when not given.
	Zone string
	// CapacityBlock is true for an EC2 capacity block (marketType CapacityBlock).
	CapacityBlock bool
}

// templateReservation reads the reservation of an infrastructure template
// and its annotations (ann: the template's, then overrides, e.g. a
// MachineDeployment's). ok is false when the template names none.
func templateReservation(t *unstructured.Unstructured, anns ...map[string]string) (r Reservation, ok bool, err error) {
	if t == nil {
		return Reservation{}, false, nil
	}
	r.ID, _, _ = unstructured.NestedString(t.Object, "spec", "template", "spec", "capacityReservationId")
	mt, _, _ := unstructured.NestedString(t.Object, "spec", "template", "spec", "marketType")
	r.CapacityBlock = strings.EqualFold(mt, "CapacityBlock")
	if r.ID == "" {
		if r.CapacityBlock {
			return r, true, fmt.Errorf("spec.template.spec.marketType is CapacityBlock without spec.template.spec.capacityReservationId: CAPA cannot launch it")
		}
		return Reservation{}, false, nil
	}
	count, zone := "", ""
	for _, ann := range anns {
		if v, ok := ann[v1alpha1.ReservationCountAnnotation]; ok {
			count = v
		}
		if v, ok := ann[v1alpha1.ReservationZoneAnnotation]; ok {
			zone = strings.TrimSpace(v)
		}
	}
	if count == "" {
		return r, true, fmt.Errorf("capacity reservation %s: annotation %q is missing: say how many instances the reservation holds", r.ID, v1alpha1.ReservationCountAnnotation)
	}
	n, perr := strconv.Atoi(strings.TrimSpace(count))
	if perr != nil || n < 0 {
		return r, true, fmt.Errorf("capacity reservation %s: annotation %q: %q is not a non-negative integer", r.ID, v1alpha1.ReservationCountAnnotation, count)
	}
	r.Count, r.Zone = n, zone
	return r, true, nil
}

// reservedZones are the zones a reservation's offering is in: the zone the
// user gave, which must be one of the Cluster's; else the Cluster's only
// zone (or none). Several zones and no annotation cannot be told apart: a
// launch into the wrong zone would fail, so it is an error.
func reservedZones(r Reservation, clusterZones []string) ([]string, error) {
	switch {
	case r.Zone != "" && len(clusterZones) > 0 && !slices.Contains(clusterZones, r.Zone):
		return nil, fmt.Errorf("capacity reservation %s: annotation %q: zone %q is not a failure domain of the Cluster (%s)",
			r.ID, v1alpha1.ReservationZoneAnnotation, r.Zone, strings.Join(clusterZones, ", "))
	case r.Zone != "":
		return []string{r.Zone}, nil
	case len(clusterZones) > 1:
		return nil, fmt.Errorf("capacity reservation %s: the Cluster has several failure domains (%s): set annotation %q to the reservation's zone",
			r.ID, strings.Join(clusterZones, ", "), v1alpha1.ReservationZoneAnnotation)
	default:
		return clusterZones, nil
	}
}

// reservedPrice is the price of a reserved offering: the reserved-price
// annotation, else a fraction of the on-demand price.
func reservedPrice(onDemand float64, problem func(string, ...any), anns ...map[string]string) float64 {
	for i := len(anns) - 1; i >= 0; i-- {
		if v, ok := anns[i][v1alpha1.ReservedPriceAnnotation]; ok {
			p, err := pricing.ParsePrice(v1alpha1.ReservedPriceAnnotation, v)
			if err == nil {
				return p
			}
			problem("%v", err)
		}
	}
	return onDemand * ReservedPriceFraction
}

// isReserved reports whether a source offers reserved capacity.
func (s *Source) isReserved() bool { return s.CapacityType == karpv1.CapacityTypeReserved }
