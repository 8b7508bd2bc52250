package instancetype

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/scheduling"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

func reservedTemplate(id string, ann map[string]string) *unstructured.Unstructured {
	all := map[string]string{v1alpha1.PriceAnnotation: "0.096"}
	for k, v := range ann {
		all[k] = v
	}
	t := awsTemplate("m5.large", false, map[string]any{"cpu": "2", "memory": "8Gi"}, all)
	_ = unstructured.SetNestedField(t.Object, id, "spec", "template", "spec", "capacityReservationId")
	return t
}

// An AWSMachineTemplate with capacityReservationId offers reserved capacity
// in the reservation's zone, with core's reservation requirement and the
// count the user gives, nearly free; and on-demand everywhere to fall back to.
func TestReservedTemplateOffersReservedAndOnDemand(t *testing.T) {
	tmpl := reservedTemplate("cr-0123", map[string]string{
		v1alpha1.ReservationCountAnnotation: "3",
		v1alpha1.ReservationZoneAnnotation:  "us-east-1b",
	})
	srcs := FromTemplate(tmpl, TemplateOptions{ClusterName: "c", Zones: []string{"us-east-1a", "us-east-1b"}})
	set := Build(srcs)
	if len(set.Problems) > 0 || len(set.InstanceTypes) != 1 {
		t.Fatalf("problems %v, types %d", set.Problems, len(set.InstanceTypes))
	}
	it := set.InstanceTypes[0]
	var reserved []*cloudprovider.Offering
	for _, of := range it.Offerings {
		key := KeyOf(it.Name, of)
		if key.CapacityType == karpv1.CapacityTypeReserved {
			reserved = append(reserved, of)
			continue
		}
		if r := of.Requirements.Get(v1alpha1.LabelCapacityReservationID); r.Operator() != "DoesNotExist" {
			t.Errorf("offering %v: reservation requirement %s, want DoesNotExist", key, r)
		}
	}
	if len(reserved) != 1 {
		t.Fatalf("want one reserved offering, got %d of %d", len(reserved), len(it.Offerings))
	}
	of := reserved[0]
	if KeyOf(it.Name, of).Zone != "us-east-1b" || of.ReservationID() != "cr-0123" || of.ReservationCapacity != 3 || !of.Launchable() {
		t.Errorf("reserved offering: zone %q id %q capacity %d launchable %v", KeyOf(it.Name, of).Zone, of.ReservationID(), of.ReservationCapacity, of.Launchable())
	}
	if of.Price <= 0 || of.Price >= 0.096/1000 {
		t.Errorf("reserved price %v, want near zero and positive", of.Price)
	}
	// What core's scheduler does with it: reserved first, by price.
	reqs := scheduling.NewRequirements(scheduling.NewRequirement(karpv1.CapacityTypeLabelKey, "In", "reserved", "on-demand"))
	if got := it.Offerings.Launchable().Compatible(reqs).Cheapest(); got != of {
		t.Errorf("cheapest launchable offering is %v, want the reserved one", KeyOf(it.Name, got))
	}
	// A NodeClaim launched from it carries the reservation label.
	for _, s := range srcs {
		if s.CapacityType == karpv1.CapacityTypeReserved && s.Labels[v1alpha1.LabelCapacityReservationID] != "cr-0123" {
			t.Errorf("reserved source labels %v", s.Labels)
		}
	}
}

// A full reservation stays available but not launchable: core falls back.
func TestFullReservationIsNotLaunchable(t *testing.T) {
	srcs := FromTemplate(reservedTemplate("cr-1", map[string]string{v1alpha1.ReservationCountAnnotation: "2"}), TemplateOptions{ClusterName: "c", Zones: []string{"z1"}})
	for i := range srcs {
		if srcs[i].ReservationID != "" {
			srcs[i].ReservationCapacity = 0
		}
	}
	it := Build(srcs).InstanceTypes[0]
	launchable := it.Offerings.Launchable()
	if len(launchable) != 1 || KeyOf(it.Name, launchable[0]).CapacityType != karpv1.CapacityTypeOnDemand {
		t.Fatalf("launchable offerings of a full reservation: %d, want the on-demand one", len(launchable))
	}
}

func TestReservationNeedsCountAndZone(t *testing.T) {
	cases := map[string]struct {
		ann   map[string]string
		zones []string
		want  string
	}{
		"no count":       {nil, []string{"z1"}, v1alpha1.ReservationCountAnnotation},
		"bad count":      {map[string]string{v1alpha1.ReservationCountAnnotation: "lots"}, []string{"z1"}, "not a non-negative integer"},
		"several zones":  {map[string]string{v1alpha1.ReservationCountAnnotation: "1"}, []string{"z1", "z2"}, v1alpha1.ReservationZoneAnnotation},
		"zone not found": {map[string]string{v1alpha1.ReservationCountAnnotation: "1", v1alpha1.ReservationZoneAnnotation: "z9"}, []string{"z1", "z2"}, "not a failure domain"},
	}
	for name, c := range cases {
		srcs := FromTemplate(reservedTemplate("cr-9", c.ann), TemplateOptions{ClusterName: "c", Zones: c.zones})
		if len(srcs) != 1 || srcs[0].Err == nil || !strings.Contains(srcs[0].Err.Error(), c.want) || !strings.Contains(srcs[0].Err.Error(), "AWSMachineTemplate ns/t") {
			t.Errorf("%s: want an error naming the template and %q, got %v", name, c.want, srcs[0].Err)
		}
	}
}

// MachineDeployment mode: all replicas of a MachineDeployment whose template
// names a reservation hold slots of it.
func TestReservedMachineDeploymentCountsItsReplicas(t *testing.T) {
	tmpl := reservedTemplate("cr-md", map[string]string{v1alpha1.ReservationCountAnnotation: "4"})
	d := md("reserved", nil, "us-east-1a", 3)
	src := FromMachineDeployment(d, tmpl)
	if src.Err != nil || src.CapacityType != karpv1.CapacityTypeReserved || src.ReservationCapacity != 1 {
		t.Fatalf("source: err %v type %s capacity %d", src.Err, src.CapacityType, src.ReservationCapacity)
	}
	if src.Labels[v1alpha1.LabelCapacityReservationID] != "cr-md" || src.Price >= 0.001 {
		t.Errorf("labels %v price %v", src.Labels, src.Price)
	}
}

// A capacity block needs its reservation ID (CAPA refuses one without): the
// template is reported, not launched from.
func TestCapacityBlockWithoutReservationIsReported(t *testing.T) {
	tmpl := awsTemplate("m5.large", false, map[string]any{"cpu": "2", "memory": "8Gi"}, nil)
	_ = unstructured.SetNestedField(tmpl.Object, "CapacityBlock", "spec", "template", "spec", "marketType")
	srcs := FromTemplate(tmpl, TemplateOptions{ClusterName: "c"})
	if len(srcs) != 1 || srcs[0].Err == nil || !strings.Contains(srcs[0].Err.Error(), "capacityReservationId") {
		t.Fatalf("want one error naming capacityReservationId, got %+v", srcs)
	}
}
