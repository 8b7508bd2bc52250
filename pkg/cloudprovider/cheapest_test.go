package cloudprovider

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	corecloudprovider "sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

func source(name, zone, capacityType string, price float64) instancetype.Source {
	capacity := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110")}
	return instancetype.Source{
		Origin: types.NamespacedName{Namespace: "ns", Name: name}, Name: "m5.large", Arch: "amd64", OS: "linux",
		Zone: zone, CapacityType: capacityType, Price: price, Available: true,
		Capacity: capacity, Allocatable: capacity,
	}
}

func claim(reqs ...karpv1.NodeSelectorRequirementWithMinValues) *karpv1.NodeClaim {
	return &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: karpv1.NodeClaimSpec{Requirements: reqs}}
}

// Offerings without a zone (a MachineDeployment without a failure domain)
// must launch, from the same origin at every call: the last round saw 84
// failed launches because the origin was looked up by Offering.Zone(), a
// random value for an offering without a zone requirement.
func TestCheapestFindsOfferingsWithoutAZone(t *testing.T) {
	set := instancetype.Build([]instancetype.Source{
		source("workers", "", karpv1.CapacityTypeOnDemand, 0.096),
		source("workers-spot", "", karpv1.CapacityTypeSpot, 0.04),
	})
	for _, tc := range []struct {
		name string
		nc   *karpv1.NodeClaim
		want string
	}{
		{"any capacity type", claim(), "workers-spot"},
		{"on-demand only", claim(karpv1.NodeSelectorRequirementWithMinValues{Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{karpv1.CapacityTypeOnDemand}}), "workers"},
		{"a zone ruled out", claim(karpv1.NodeSelectorRequirementWithMinValues{Key: corev1.LabelTopologyZone, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"us-east-1b"}}), "workers-spot"},
	} {
		for i := 0; i < 50; i++ {
			srcs, err := cheapest(set, set.InstanceTypes, tc.nc)
			if err != nil {
				t.Fatalf("%s, call %d: %v", tc.name, i, err)
			}
			src := srcs[0]
			if src.Origin.Name != tc.want {
				t.Fatalf("%s, call %d: launched from %s, want %s", tc.name, i, src.Origin.Name, tc.want)
			}
		}
	}
}

// One zone of three: the zoned MachineDeployment serves pods that ask for its
// zone, and the zoneless one never serves a NodeClaim that asks for a zone:
// its node could land in any zone (Karpenter's DefaultTopologySpreadConstraints
// conformance specs found four pods spread over "four zones" all in one).
func TestCheapestOneZoneOfThree(t *testing.T) {
	set := instancetype.Build([]instancetype.Source{
		source("in-a", "us-east-1a", karpv1.CapacityTypeOnDemand, 0.09),
		source("anywhere", "", karpv1.CapacityTypeOnDemand, 0.096),
	})
	zone := func(z string) *karpv1.NodeClaim {
		return claim(karpv1.NodeSelectorRequirementWithMinValues{Key: corev1.LabelTopologyZone, Operator: corev1.NodeSelectorOpIn, Values: []string{z}})
	}
	for _, tc := range []struct {
		nc   *karpv1.NodeClaim
		want string
	}{{claim(), "in-a"}, {zone("us-east-1a"), "in-a"}} {
		srcs, err := cheapest(set, set.InstanceTypes, tc.nc)
		if err != nil || len(srcs) != 1 || srcs[0].Origin.Name != tc.want {
			t.Fatalf("requirements %v: got %v (%v), want %s", tc.nc.Spec.Requirements, srcs, err, tc.want)
		}
	}
	// Cheaper in no particular zone: still only for NodeClaims without a zone.
	set = instancetype.Build([]instancetype.Source{
		source("in-a", "us-east-1a", karpv1.CapacityTypeOnDemand, 0.096),
		source("anywhere", "", karpv1.CapacityTypeOnDemand, 0.09),
	})
	for _, tc := range []struct {
		nc   *karpv1.NodeClaim
		want string
	}{{claim(), "anywhere"}, {zone("us-east-1a"), "in-a"}} {
		srcs, err := cheapest(set, set.InstanceTypes, tc.nc)
		if err != nil || len(srcs) != 1 || srcs[0].Origin.Name != tc.want {
			t.Fatalf("requirements %v: got %v (%v), want %s", tc.nc.Spec.Requirements, srcs, err, tc.want)
		}
	}
	if srcs, err := cheapest(set, set.InstanceTypes, zone("us-east-1c")); err == nil || !corecloudprovider.IsInsufficientCapacityError(err) {
		t.Fatalf("a NodeClaim asking for us-east-1c got %v (%v), want an insufficient capacity error", srcs, err)
	}
}

// Equal prices: every source of the cheapest price comes back, the one
// found first first (the mode chooses among them); a cheaper one alone wins.
func TestCheapestReturnsEveryTie(t *testing.T) {
	set := instancetype.Build([]instancetype.Source{
		source("md-b", "us-east-1a", karpv1.CapacityTypeOnDemand, 0.096),
		source("md-a", "us-east-1a", karpv1.CapacityTypeOnDemand, 0.096),
		source("md-c", "us-east-1b", karpv1.CapacityTypeOnDemand, 0.096),
		source("md-dear", "us-east-1c", karpv1.CapacityTypeOnDemand, 0.2),
	})
	srcs, err := cheapest(set, set.InstanceTypes, claim())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range srcs {
		got = append(got, s.Origin.Name)
	}
	if len(got) != 3 || !slices.Contains(got, "md-a") || !slices.Contains(got, "md-b") || !slices.Contains(got, "md-c") {
		t.Fatalf("ties %v, want md-a, md-b and md-c", got)
	}
	for i := 0; i < 20; i++ {
		again, _ := cheapest(set, set.InstanceTypes, claim())
		if again[0].Origin != srcs[0].Origin {
			t.Fatalf("first tie %s, then %s: the first must not change between calls", srcs[0].Origin, again[0].Origin)
		}
	}
	cheaper := instancetype.Build(append(slices.Clone(sourcesOf(set)), source("md-cheap", "us-east-1c", karpv1.CapacityTypeOnDemand, 0.05)))
	if srcs, err := cheapest(cheaper, cheaper.InstanceTypes, claim()); err != nil || len(srcs) != 1 || srcs[0].Origin.Name != "md-cheap" {
		t.Fatalf("with a cheaper offering: %v (%v), want md-cheap alone", srcs, err)
	}
}

func sourcesOf(set *instancetype.Set) []instancetype.Source {
	var out []instancetype.Source
	for _, srcs := range set.Origins {
		out = append(out, srcs...)
	}
	return out
}
