package instancetype

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/scheduling"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// nodeLabels are what a registered node of a zoneless MachineDeployment
// carries, and its NodeClaim once the zone controller copied the zone.
func nodeLabels(instanceType, zone string) map[string]string {
	return map[string]string{
		corev1.LabelInstanceTypeStable: instanceType,
		corev1.LabelTopologyZone:       zone,
		karpv1.CapacityTypeLabelKey:    karpv1.CapacityTypeOnDemand,
	}
}

func find(its []*cloudprovider.InstanceType, name string) *cloudprovider.InstanceType {
	for _, it := range its {
		if it.Name == name {
			return it
		}
	}
	return nil
}

// The simplest clusterctl worker pool (no failure domain) beside a zoned
// one: once a node of the zoneless pool is up in us-east-1b, Karpenter core
// looks its offering up by the node's zone. Core's drift check (an hour
// after launch) wants a compatible offering, its consolidation and cost
// tracking the offering's price. A price record in every known zone gives
// both, and still offers nothing a pod asking for a zone could launch.
func TestZonelessOfferingIsFoundInTheZoneItsNodeLandedIn(t *testing.T) {
	t3 := awsTemplate("t3.medium", false, map[string]any{"cpu": "2", "memory": "4Gi"}, nil)
	m5 := awsTemplate("m5.large", false, map[string]any{"cpu": "2", "memory": "8Gi"}, nil)
	set := Build([]Source{
		FromMachineDeployment(md("workers", map[string]string{v1alpha1.PriceAnnotation: "0.0416"}, "", 0), t3),
		FromMachineDeployment(md("zoned", map[string]string{v1alpha1.PriceAnnotation: "0.096"}, "us-east-1a", 0), m5),
	}, "us-east-1b")
	it := find(set.InstanceTypes, "t3.medium")
	if it == nil {
		t.Fatal("no t3.medium")
	}
	for _, zone := range []string{"us-east-1a", "us-east-1b"} {
		// What core's drift check asks (nodeclaim/disruption instanceTypeNotFound).
		if !it.Offerings.HasCompatible(scheduling.NewLabelRequirements(nodeLabels("t3.medium", zone))) {
			t.Errorf("%s: no offering compatible with the node's labels: core would mark it drifted (InstanceTypeNotFound) an hour after launch", zone)
		}
		// What core's consolidation and cost tracking ask.
		if p, ok := it.OfferingPrice(zone, karpv1.CapacityTypeOnDemand); !ok || p != 0.0416 {
			t.Errorf("%s: price %v (found %t), want 0.0416: consolidation would price the node at 0", zone, p, ok)
		}
	}
	// Nothing launchable in a zone: a pod that asks for one is not served by
	// the zoneless pool (its Machines land wherever the infrastructure puts them).
	inZone := scheduling.NewRequirements(scheduling.NewRequirement(corev1.LabelTopologyZone, corev1.NodeSelectorOpIn, "us-east-1b"))
	if got := it.Offerings.Available().Compatible(inZone); len(got) != 0 {
		t.Errorf("available offerings in us-east-1b: %v, want none", got)
	}
	if got := it.Offerings.Available(); len(got) != 1 || KeyOf(it.Name, got[0]).Zone != "" {
		t.Errorf("available offerings %v, want the zoneless one only", got)
	}
	// The zoned type gets nothing extra.
	if m := find(set.InstanceTypes, "m5.large"); m == nil || len(m.Offerings) != 1 {
		t.Errorf("m5.large offerings: %v, want its own one", m)
	}
	// No price record is anybody's origin.
	for k := range set.Origins {
		if k.InstanceType == "t3.medium" && k.Zone != "" {
			t.Errorf("origin for price record %+v", k)
		}
	}
}

// A zone noted after the Set was built (a node registered there) rebuilds
// the store's Sets with a record for it.
func TestStoreRebuildsWhenAZoneIsNoted(t *testing.T) {
	s := NewStore()
	zones := NewZones()
	s.UseZones(zones)
	changes := s.Subscribe()
	s.Put(FromMachineDeployment(md("workers", map[string]string{v1alpha1.PriceAnnotation: "0.0416"}, "", 0),
		awsTemplate("t3.medium", false, map[string]any{"cpu": "2", "memory": "4Gi"}, nil)))
	<-changes
	priced := func() bool {
		it := find(s.Resolve(labels.Everything(), "all").InstanceTypes, "t3.medium")
		_, ok := it.OfferingPrice("us-east-1c", karpv1.CapacityTypeOnDemand)
		return ok
	}
	if priced() {
		t.Fatal("a price record in a zone nobody knows")
	}
	if !zones.Note("us-east-1c") || zones.Note("us-east-1c") {
		t.Fatal("Note: want new once, then known")
	}
	select {
	case <-changes:
	default:
		t.Fatal("a new zone did not signal the store's listeners")
	}
	if !priced() {
		t.Fatal("the Set was not rebuilt with the new zone")
	}
}
