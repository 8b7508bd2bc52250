package nodeclass

import (
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
)

// The price gauge of offerings without a zone is labelled zone="" at every
// resolution: the set of series stays what the offerings are, never one
// more per call (Offering.Zone() would give a random zone each time).
func TestPriceSeriesOfZonelessOfferingsAreBounded(t *testing.T) {
	capacity := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110")}
	src := func(name, zone, ct string) instancetype.Source {
		return instancetype.Source{Origin: types.NamespacedName{Namespace: "ns", Name: name}, Name: "m5.large", Arch: "amd64", OS: "linux",
			Zone: zone, CapacityType: ct, Price: 0.1, Available: true, Capacity: capacity, Allocatable: capacity}
	}
	set := instancetype.Build([]instancetype.Source{
		src("a", "", karpv1.CapacityTypeOnDemand), src("b", "", karpv1.CapacityTypeSpot), src("c", "us-east-1a", karpv1.CapacityTypeOnDemand),
	})
	r := &Resolver{}
	for i := 0; i < 20; i++ {
		r.recordPrices("zoneless-test", set)
	}
	var got []string
	for _, m := range gather(t) {
		l := labels(m)
		if l["nodeclass"] == "zoneless-test" {
			got = append(got, l["zone"]+"/"+l["capacity_type"])
		}
	}
	sort.Strings(got)
	// us-east-1a/spot: the zoneless spot offering's price record in the
	// zone the others know (instancetype.Zones).
	want := []string{"/on-demand", "/spot", "us-east-1a/on-demand", "us-east-1a/spot"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("price series (zone/capacity type) %v, want %v", got, want)
	}
}

func gather(t *testing.T) []*dto.Metric {
	t.Helper()
	ch := make(chan prometheus.Metric, 1000)
	metrics.OfferingPrice.Collect(ch)
	close(ch)
	var out []*dto.Metric
	for m := range ch {
		d := &dto.Metric{}
		if err := m.Write(d); err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, p := range m.GetLabel() {
		out[p.GetName()] = p.GetValue()
	}
	return out
}
