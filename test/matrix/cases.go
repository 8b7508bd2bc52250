// Package matrix checks the cloud provider against every combination of
// how users write their Cluster API objects: zone or no zone, on-demand,
// spot or both, price annotation, legacy price annotation or no price,
// capacity from annotations, from template status or both, MachineDeployment
// or Machine mode, one or several sources of the same instance type. The
// cases are generated, not picked; only combinations a mode cannot express
// are skipped, each with its reason (Skip).
package matrix

import (
	"fmt"
	"math"

	"k8s.io/apimachinery/pkg/api/resource"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/pricing"
)

// Dimensions of the matrix.
const (
	ModeMachineDeployment = "md"
	ModeMachine           = "m"

	CapacityOnDemand = "od"
	CapacitySpot     = "spot"
	CapacityBoth     = "both"

	PriceAnnotation = "price"
	PriceLegacy     = "legacy"
	PriceNone       = "none"

	ShapeAnnotations = "ann"
	ShapeStatus      = "status"
	ShapeBoth        = "both"
)

// InstanceType is every source's instance type (2 vCPU, 8Gi in the world's
// catalogue); annotations say 7936Mi so that the test sees which won.
const (
	InstanceType     = "m5.large"
	StatusMemory     = "8Gi"
	AnnotationMemory = "7936Mi"
	CPU              = "2"
)

// Case is one combination.
type Case struct {
	Mode, Capacity, Price, Shape string
	Zoned                        bool
	Sources                      int
}

// Name is a short DNS-1123 name of the case.
func (c Case) Name() string {
	z := "nozone"
	if c.Zoned {
		z = "zone"
	}
	return fmt.Sprintf("%s-%s-%s-%s-%s-%d", c.Mode, z, c.Capacity, c.Price, c.Shape, c.Sources)
}

// Skip says why a mode cannot express the case, or "".
func (c Case) Skip() string {
	switch {
	case c.Mode == ModeMachineDeployment && c.Capacity == CapacityBoth && c.Sources == 1:
		return "a MachineDeployment launches from one template, which is either on-demand or spot: both capacity types take two MachineDeployments"
	case c.Mode == ModeMachine && c.Capacity == CapacityBoth && c.Price == PriceNone:
		return "a template offers spot besides on-demand only when it carries a spot price annotation"
	}
	return ""
}

// All generates every case, skipped ones included.
func All() []Case {
	var out []Case
	for _, mode := range []string{ModeMachineDeployment, ModeMachine} {
		for _, zoned := range []bool{true, false} {
			for _, ct := range []string{CapacityOnDemand, CapacitySpot, CapacityBoth} {
				for _, price := range []string{PriceAnnotation, PriceLegacy, PriceNone} {
					for _, shape := range []string{ShapeAnnotations, ShapeStatus, ShapeBoth} {
						for _, n := range []int{1, 2} {
							out = append(out, Case{Mode: mode, Zoned: zoned, Capacity: ct, Price: price, Shape: shape, Sources: n})
						}
					}
				}
			}
		}
	}
	return out
}

// Source is one object the case creates (a MachineDeployment or a template).
type Source struct {
	Index int
	// Spot: the template asks for spot (spec.spotMarketOptions); OnDemand
	// and SpotPrice are the prices the source's annotations state
	// (0: none), Legacy whether the on-demand one is the legacy key.
	Spot              bool
	OnDemand, SpotFee float64
	Legacy            bool
}

// Sources are the case's sources. Source 1 is cheaper than source 0, so
// the cheapest offering always has one right answer where prices are set.
func (c Case) SourceList() []Source {
	var out []Source
	for i := 0; i < c.Sources; i++ {
		s := Source{Index: i}
		switch c.Capacity {
		case CapacitySpot:
			s.Spot = true
		case CapacityBoth:
			// Machine mode: one template offers both; MachineDeployment mode:
			// one on-demand and one spot MachineDeployment.
			s.Spot = c.Mode == ModeMachineDeployment && i == 1
		}
		od, sp := 0.2-0.1*float64(i), 0.08-0.03*float64(i)
		switch c.Price {
		case PriceAnnotation:
			s.OnDemand, s.SpotFee = od, sp
		case PriceLegacy:
			s.OnDemand, s.Legacy = od, true
			if c.Mode == ModeMachine && c.Capacity == CapacityBoth {
				s.SpotFee = sp // there is no legacy spot key; without it no spot offering
			}
		}
		if c.Mode == ModeMachineDeployment && s.Spot {
			s.OnDemand = 0 // a spot MachineDeployment's on-demand price means nothing
		}
		out = append(out, s)
	}
	return out
}

// Offering is an expected offering: its zone ("" for none), capacity type,
// price, and the sources it launches from, cheapest first.
type Offering struct {
	Zone, CapacityType string
	Price              float64
	Cheapest           []int // indexes of the sources at that price
}

// Expected computes the offerings the provider must return, from the
// documented rules: a MachineDeployment offers its template's capacity type
// in its failure domain (no zone without one); a template offers on-demand,
// or spot only when it asks for spot, and spot too when it carries a spot
// price annotation, in each of the Cluster's zones (no zone without any);
// prices come from karpenter.cluster.x-k8s.io/price (on-demand), the legacy
// cluster.x-k8s.io/machine-current-price (on-demand) or
// karpenter.cluster.x-k8s.io/spot-price (spot), else the resource estimate.
func (c Case) Expected(zones []string) map[[2]string]*Offering {
	out := map[[2]string]*Offering{}
	memory := StatusMemory
	if c.Shape != ShapeStatus {
		memory = AnnotationMemory
	}
	estimate := pricing.Estimate(resource.MustParse(CPU), resource.MustParse(memory), 0)
	for _, s := range c.SourceList() {
		var cts []string
		switch {
		case s.Spot:
			cts = []string{karpv1.CapacityTypeSpot}
		case c.Mode == ModeMachine && s.SpotFee > 0:
			cts = []string{karpv1.CapacityTypeOnDemand, karpv1.CapacityTypeSpot}
		default:
			cts = []string{karpv1.CapacityTypeOnDemand}
		}
		srcZones := []string{""}
		if c.Zoned {
			srcZones = zones
		}
		for _, z := range srcZones {
			for _, ct := range cts {
				p := s.OnDemand
				if ct == karpv1.CapacityTypeSpot {
					p = s.SpotFee
				}
				if p == 0 {
					p = estimate
					if ct == karpv1.CapacityTypeSpot {
						p = pricing.SpotEstimate(estimate)
					}
				}
				k := [2]string{z, ct}
				o := out[k]
				switch {
				case o == nil:
					out[k] = &Offering{Zone: z, CapacityType: ct, Price: p, Cheapest: []int{s.Index}}
				case nearly(p, o.Price):
					o.Cheapest = append(o.Cheapest, s.Index)
				case p < o.Price:
					o.Price, o.Cheapest = p, []int{s.Index}
				}
			}
		}
	}
	return out
}

func nearly(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
