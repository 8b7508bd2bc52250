package instancetype

import (
	"testing"

	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

func TestPricePrecedence(t *testing.T) {
	capacity := map[string]any{"cpu": "2", "memory": "8Gi"}
	for _, tc := range []struct {
		name          string
		mdAnn, tmpl   map[string]string
		spot          bool
		zone          string
		want          float64
		wantEstimated bool
	}{
		{name: "machinedeployment wins over template", mdAnn: map[string]string{v1alpha1.PriceAnnotation: "0.2"}, tmpl: map[string]string{v1alpha1.PriceAnnotation: "0.3"}, want: 0.2},
		{name: "template when the machinedeployment has none", tmpl: map[string]string{v1alpha1.PriceAnnotation: "0.3"}, want: 0.3},
		{name: "compatibility annotation", mdAnn: map[string]string{v1alpha1.CurrentPriceAnnotation: "0.25"}, want: 0.25},
		{name: "own annotation wins over compatibility one", mdAnn: map[string]string{v1alpha1.CurrentPriceAnnotation: "0.25", v1alpha1.PriceAnnotation: "0.2"}, want: 0.2},
		{name: "spot reads spot-price", spot: true, mdAnn: map[string]string{v1alpha1.PriceAnnotation: "0.2", v1alpha1.SpotPriceAnnotation: "0.07"}, want: 0.07},
		{name: "per-zone override", zone: "us-east-1b", spot: true,
			tmpl: map[string]string{v1alpha1.SpotPriceAnnotation: "0.07", v1alpha1.SpotPriceAnnotation + ".us-east-1b": "0.05"}, want: 0.05},
		{name: "per-zone override of another zone is ignored", zone: "us-east-1a", spot: true,
			tmpl: map[string]string{v1alpha1.SpotPriceAnnotation: "0.07", v1alpha1.SpotPriceAnnotation + ".us-east-1b": "0.05"}, want: 0.07},
		{name: "bad machinedeployment price falls to the template's", mdAnn: map[string]string{v1alpha1.PriceAnnotation: "-1"}, tmpl: map[string]string{v1alpha1.PriceAnnotation: "0.3"}, want: 0.3},
		{name: "no price: estimate", wantEstimated: true},
		{name: "spot without spot price: spot estimate", spot: true, mdAnn: map[string]string{v1alpha1.PriceAnnotation: "0.2"}, wantEstimated: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := FromMachineDeployment(md("a", tc.mdAnn, tc.zone, 0), awsTemplate("m5.large", tc.spot, capacity, tc.tmpl))
			if src.Err != nil {
				t.Fatal(src.Err)
			}
			if src.PriceEstimated != tc.wantEstimated {
				t.Fatalf("estimated = %v, want %v (price %v)", src.PriceEstimated, tc.wantEstimated, src.Price)
			}
			if !tc.wantEstimated && src.Price != tc.want {
				t.Fatalf("price = %v, want %v", src.Price, tc.want)
			}
			if src.Price <= 0 {
				t.Fatalf("price must be positive, got %v", src.Price)
			}
		})
	}
	onDemand := FromMachineDeployment(md("a", nil, "", 0), awsTemplate("m5.large", false, capacity, nil))
	spot := FromMachineDeployment(md("a", nil, "", 0), awsTemplate("m5.large", true, capacity, nil))
	if spot.CapacityType != karpv1.CapacityTypeSpot || !(spot.Price < onDemand.Price) {
		t.Fatalf("the spot estimate (%v) must be below the on-demand estimate (%v)", spot.Price, onDemand.Price)
	}
	bigger := FromMachineDeployment(md("a", nil, "", 0), awsTemplate("m5.xlarge", false, map[string]any{"cpu": "4", "memory": "16Gi"}, nil))
	if !(bigger.Price > onDemand.Price) {
		t.Fatalf("the estimate must grow with the shape: %v vs %v", bigger.Price, onDemand.Price)
	}
}
