package instancetype

import (
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/scheduling"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// A MachineDeployment written as most clusterctl templates write a worker
// pool has no failure domain. Its offering has no zone: its key must be the
// same at every call (Offering.Zone() would be random) and find its origin.
func TestOfferingWithoutZoneHasAStableKey(t *testing.T) {
	tmpl := awsTemplate("m5.large", false, map[string]any{"cpu": "2", "memory": "8Gi"}, nil)
	set := Build([]Source{FromMachineDeployment(md("workers", map[string]string{v1alpha1.PriceAnnotation: "0.096"}, "", 0), tmpl)})
	if len(set.InstanceTypes) != 1 || len(set.InstanceTypes[0].Offerings) != 1 {
		t.Fatalf("want one instance type with one offering, got %+v", set.InstanceTypes)
	}
	it := set.InstanceTypes[0]
	if it.Requirements.Has(corev1.LabelTopologyZone) {
		t.Fatalf("an instance type without zones must not require one: %s", it.Requirements)
	}
	want := OfferingKey{InstanceType: "m5.large", Zone: "", CapacityType: karpv1.CapacityTypeOnDemand}
	for i := 0; i < 100; i++ {
		if got := KeyOf(it.Name, it.Offerings[0]); got != want {
			t.Fatalf("call %d: key %+v, want %+v", i, got, want)
		}
	}
	if o := set.Origins[want]; len(o) != 1 || o[0].Origin.Name != "workers" {
		t.Fatalf("the key must find MachineDeployment workers, got %+v", o)
	}
}

// A zoned and a zoneless source of one type: the zoneless one may land in
// any zone, so the type must not be restricted to the zoned one's zone.
func TestMixedZonedAndZonelessSourcesDoNotRestrictTheZone(t *testing.T) {
	tmpl := awsTemplate("m5.large", false, map[string]any{"cpu": "2", "memory": "8Gi"}, nil)
	set := Build([]Source{
		FromMachineDeployment(md("zoned", map[string]string{v1alpha1.PriceAnnotation: "0.096"}, "us-east-1a", 0), tmpl),
		FromMachineDeployment(md("anywhere", map[string]string{v1alpha1.PriceAnnotation: "0.09"}, "", 0), tmpl),
	})
	it := set.InstanceTypes[0]
	if it.Requirements.Has(corev1.LabelTopologyZone) {
		t.Fatalf("zone requirement %s would exclude the zoneless MachineDeployment's nodes", it.Requirements.Get(corev1.LabelTopologyZone))
	}
	keys := map[OfferingKey]bool{}
	for _, of := range it.Offerings {
		keys[KeyOf(it.Name, of)] = true
	}
	for _, k := range []OfferingKey{
		{InstanceType: "m5.large", Zone: "us-east-1a", CapacityType: karpv1.CapacityTypeOnDemand},
		{InstanceType: "m5.large", Zone: "", CapacityType: karpv1.CapacityTypeOnDemand},
	} {
		if !keys[k] || len(set.Origins[k]) != 1 {
			t.Fatalf("offering %+v missing (keys %v, origins %v)", k, keys, set.Origins[k])
		}
	}
}

// Machine mode: a Cluster without failure domains (or not known yet) gives
// each template one offering per capacity type, in no zone.
func TestTemplateInAClusterWithoutFailureDomains(t *testing.T) {
	tmpl := awsTemplate("c5.xlarge", false, map[string]any{"cpu": "4", "memory": "8Gi"},
		map[string]string{v1alpha1.PriceAnnotation: "0.17", v1alpha1.SpotPriceAnnotation: "0.07"})
	set := Build(FromTemplate(tmpl, TemplateOptions{ClusterName: "c1", SpotCapable: true}))
	if len(set.InstanceTypes) != 1 {
		t.Fatalf("want one instance type, got %d (%v)", len(set.InstanceTypes), set.Problems)
	}
	it := set.InstanceTypes[0]
	got := map[OfferingKey]float64{}
	for _, of := range it.Offerings {
		got[KeyOf(it.Name, of)] = of.Price
	}
	want := map[OfferingKey]float64{
		{InstanceType: "c5.xlarge", CapacityType: karpv1.CapacityTypeOnDemand}: 0.17,
		{InstanceType: "c5.xlarge", CapacityType: karpv1.CapacityTypeSpot}:     0.07,
	}
	if len(got) != len(want) {
		t.Fatalf("offerings %v, want %v", got, want)
	}
	for k, p := range want {
		if got[k] != p {
			t.Fatalf("offering %+v price %v, want %v (all: %v)", k, got[k], p, got)
		}
	}
}

// Core reads offerings through its own helpers: Offering.Zone() (its cost
// tracking keys on it) and Offerings.Compatible (the scheduler's choice). A
// zoneless offering must give core "" rather than a random zone, serve any
// NodeClaim that does not ask for a zone and none that does.
func TestZonelessOfferingAsCoreSeesIt(t *testing.T) {
	tmpl := awsTemplate("m5.large", false, map[string]any{"cpu": "2", "memory": "8Gi"}, nil)
	set := Build([]Source{
		FromMachineDeployment(md("zoned", map[string]string{v1alpha1.PriceAnnotation: "0.096"}, "us-east-1a", 0), tmpl),
		FromMachineDeployment(md("anywhere", map[string]string{v1alpha1.PriceAnnotation: "0.09"}, "", 0), tmpl),
	})
	it := set.InstanceTypes[0]
	var zoneless *cloudprovider.Offering
	for _, of := range it.Offerings {
		if KeyOf(it.Name, of).Zone == "" {
			zoneless = of
		}
	}
	if zoneless == nil {
		t.Fatalf("no zoneless offering among %v", it.Offerings)
	}
	for i := 0; i < 100; i++ {
		if z := zoneless.Zone(); z != "" {
			t.Fatalf("call %d: core's Offering.Zone() of the zoneless offering is %q, want \"\"", i, z)
		}
	}
	zone := func(op corev1.NodeSelectorOperator, values ...string) scheduling.Requirements {
		return scheduling.NewRequirements(scheduling.NewRequirement(corev1.LabelTopologyZone, op, values...))
	}
	for _, tc := range []struct {
		name  string
		reqs  scheduling.Requirements
		zones []string // zones of the compatible offerings ("" for none)
	}{
		{"no zone asked", scheduling.NewRequirements(), []string{"", "us-east-1a"}},
		{"its zone asked", zone(corev1.NodeSelectorOpIn, "us-east-1a"), []string{"us-east-1a"}},
		{"another zone asked", zone(corev1.NodeSelectorOpIn, "us-east-1c"), nil},
		{"any of several zones", zone(corev1.NodeSelectorOpIn, "us-east-1a", "us-east-1b"), []string{"us-east-1a"}},
	} {
		var got []string
		for _, of := range it.Offerings.Compatible(tc.reqs) {
			got = append(got, KeyOf(it.Name, of).Zone)
		}
		sort.Strings(got)
		if strings.Join(got, ",") != strings.Join(tc.zones, ",") {
			t.Errorf("%s: compatible offerings in zones %q, want %q", tc.name, got, tc.zones)
		}
	}
}
