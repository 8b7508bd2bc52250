package instancetype

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/capacity"
	"github.com/autonode/karpenter-clusterapi/pkg/kubelet"
)

func offeringsOf(srcs []Source) map[OfferingKey]Source {
	out := map[OfferingKey]Source{}
	for _, s := range srcs {
		out[OfferingKey{InstanceType: s.Name, Zone: s.Zone, CapacityType: s.CapacityType}] = s
	}
	return out
}

func TestFromTemplateOffersEveryZoneAndPricesEach(t *testing.T) {
	tmpl := awsTemplate("m5.large", false, map[string]any{"cpu": "2", "memory": "8Gi"}, map[string]string{
		v1alpha1.PriceAnnotation:                  "0.096",
		v1alpha1.PriceAnnotation + ".us-east-1b":  "0.1",
		v1alpha1.SpotPriceAnnotation:              "0.03",
		v1alpha1.SpotPriceAnnotation + ".garbage": "x",
	})
	srcs := FromTemplate(tmpl, TemplateOptions{ClusterName: "c1", Zones: []string{"us-east-1a", "us-east-1b"}, SpotCapable: true})
	got := offeringsOf(srcs)
	if len(got) != 4 {
		t.Fatalf("want 2 zones x 2 capacity types, got %v", got)
	}
	for k, s := range got {
		if s.Err != nil || s.Labels[corev1.LabelTopologyZone] != k.Zone || s.Labels[karpv1.CapacityTypeLabelKey] != k.CapacityType {
			t.Fatalf("offering %v: %+v", k, s)
		}
	}
	if p := got[OfferingKey{"m5.large", "us-east-1b", "on-demand"}].Price; p != 0.1 {
		t.Errorf("zone price: got %v, want 0.1", p)
	}
	if p := got[OfferingKey{"m5.large", "us-east-1a", "on-demand"}].Price; p != 0.096 {
		t.Errorf("price: got %v, want 0.096", p)
	}
	if p := got[OfferingKey{"m5.large", "us-east-1a", "spot"}].Price; p != 0.03 {
		t.Errorf("spot price: got %v, want 0.03", p)
	}
}

func TestFromTemplateCapacityTypes(t *testing.T) {
	priced := map[string]string{v1alpha1.SpotPriceAnnotation: "0.03"}
	cases := []struct {
		name        string
		spot        bool
		ann         map[string]string
		spotCapable bool
		want        []string
	}{
		{"no spot price: on-demand only", false, nil, true, []string{"on-demand"}},
		{"spot price, spot-capable kind: both", false, priced, true, []string{"on-demand", "spot"}},
		{"spot price, kind cannot be made spot: on-demand", false, priced, false, []string{"on-demand"}},
		{"template asks for spot: spot only", true, nil, true, []string{"spot"}},
		// CAPA's marketType: OnDemand said explicitly still allows a spot clone;
		// a capacity block is reserved capacity and never spot.
		{"marketType OnDemand, spot price: both", false, priced, true, []string{"on-demand", "spot"}},
		// (with its capacityReservationId, which CAPA requires for CapacityBlock)
		{"marketType CapacityBlock, spot price: on-demand and reserved", false, priced, true, []string{"on-demand", "reserved"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tmpl := awsTemplate("m5.large", c.spot, map[string]any{"cpu": "2", "memory": "8Gi"}, c.ann)
			if mt, ok := strings.CutPrefix(c.name, "marketType "); ok {
				mt, _, _ = strings.Cut(mt, ",")
				if err := unstructured.SetNestedField(tmpl.Object, mt, "spec", "template", "spec", "marketType"); err != nil {
					t.Fatal(err)
				}
				if mt == "CapacityBlock" {
					_ = unstructured.SetNestedField(tmpl.Object, "cr-block", "spec", "template", "spec", "capacityReservationId")
					ann := map[string]string{v1alpha1.ReservationCountAnnotation: "2"}
					for k, v := range c.ann {
						ann[k] = v
					}
					tmpl.SetAnnotations(ann)
				}
			}
			srcs := FromTemplate(tmpl, TemplateOptions{ClusterName: "c1", SpotCapable: c.spotCapable})
			var got []string
			for _, s := range srcs {
				got = append(got, s.CapacityType)
				if s.Zone != "" {
					t.Fatalf("no failure domains: want no zone, got %q", s.Zone)
				}
			}
			if strings.Join(got, ",") != strings.Join(c.want, ",") {
				t.Fatalf("capacity types %v, want %v", got, c.want)
			}
		})
	}
}

func TestFromTemplateUnusableTemplatesAreReportedOnce(t *testing.T) {
	bad := awsTemplate("m5.large", false, map[string]any{"cpu": "2", "memory": "8Gi"}, map[string]string{capacity.CPUKey: "two"})
	srcs := FromTemplate(bad, TemplateOptions{Zones: []string{"a", "b", "c"}})
	if len(srcs) != 1 || srcs[0].Err == nil || !strings.Contains(srcs[0].Err.Error(), capacity.CPUKey) {
		t.Fatalf("a malformed capacity annotation must make one unusable source naming the key, got %+v", srcs)
	}
	noShape := awsTemplate("", false, nil, nil)
	if srcs := FromTemplate(noShape, TemplateOptions{}); len(srcs) != 1 || srcs[0].Err == nil {
		t.Fatalf("a template without instance type or capacity is unusable, got %+v", srcs)
	}
}

func TestFromTemplateUsesTheBootstrapKubeletSettings(t *testing.T) {
	pods := int64(20)
	srcs := FromTemplate(awsTemplate("m5.large", false, map[string]any{"cpu": "2", "memory": "8Gi"}, nil),
		TemplateOptions{Zones: []string{"a"}, Kubelet: kubelet.Config{MaxPods: &pods}})
	if got := srcs[0].Allocatable.Pods().Value(); got != 20 {
		t.Fatalf("allocatable pods %d, want the bootstrap's max-pods 20", got)
	}
	if got := srcs[0].Capacity.Pods().Value(); got != 20 {
		t.Fatalf("pods capacity %d, want 20", got)
	}
}
