package instancetype

import (
	"testing"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

func TestParseNameByScheme(t *testing.T) {
	cases := []struct {
		name string
		want ParsedName
	}{
		{"m5d.2xlarge", ParsedName{SchemeAWS, "m", "m5d", "5", "2xlarge", "d"}},
		{"inf2.xlarge", ParsedName{SchemeAWS, "inf", "inf2", "2", "xlarge", ""}},
		{"u-6tb1.metal", ParsedName{SchemeAWS, "u", "u-6tb1", "1", "metal", ""}},
		{"c6gd.medium", ParsedName{SchemeAWS, "c", "c6gd", "6", "medium", "gd"}},
		{"m7i-flex.large", ParsedName{SchemeAWS, "m", "m7i-flex", "7", "large", "i-flex"}},
		{"Standard_D4s_v5", ParsedName{SchemeAzure, "d", "dsv5", "5", "4", ""}},
		{"Standard_E4-2ads_v5", ParsedName{SchemeAzure, "e", "eadsv5", "5", "4-2", ""}},
		{"Standard_NC24ads_A100_v4", ParsedName{SchemeAzure, "n", "ncadsv4", "4", "24", ""}},
		{"Standard_B2ms", ParsedName{SchemeAzure, "b", "bmsv1", "1", "2", ""}},
		{"n2-standard-4", ParsedName{SchemeGCP, "n", "n2", "2", "standard-4", ""}},
		{"c3d-highcpu-8", ParsedName{SchemeGCP, "c", "c3d", "3", "highcpu-8", ""}},
		{"e2-medium", ParsedName{SchemeGCP, "e", "e2", "2", "medium", ""}},
	}
	for _, c := range cases {
		got, ok := ParseName(c.name)
		if !ok || got != c.want {
			t.Errorf("ParseName(%q) = %+v, %v; want %+v", c.name, got, ok, c.want)
		}
	}
	for _, name := range []string{"worker", "big-box", "m5", "Standard_", "custom.large.x"} {
		if got, ok := ParseName(name); ok {
			t.Errorf("ParseName(%q) = %+v, want no scheme", name, got)
		}
	}
}

// The labels a NodeClaim (and so its Node) carries, and that a capacity
// labels annotation wins over a derived value.
func TestSourceLabelsCarryInstanceLabels(t *testing.T) {
	tmpl := awsTemplate("g5.2xlarge", false, map[string]any{"cpu": "8", "memory": "32Gi"}, map[string]string{
		"capacity.cluster-autoscaler.kubernetes.io/gpu-count": "1",
		"capacity.cluster-autoscaler.kubernetes.io/labels":    v1alpha1.LabelInstanceFamily + "=custom",
	})
	src := FromTemplate(tmpl, TemplateOptions{ClusterName: "c"})[0]
	want := map[string]string{
		v1alpha1.LabelInstanceCPU: "8", v1alpha1.LabelInstanceMemory: "32768", v1alpha1.LabelInstanceGPUCount: "1",
		v1alpha1.LabelInstanceGPUName: "a10g", v1alpha1.LabelInstanceGPUManufacturer: "nvidia", v1alpha1.LabelInstanceGPUMemory: "24576",
		v1alpha1.LabelInstanceFamily: "custom", v1alpha1.LabelInstanceSize: "2xlarge", v1alpha1.LabelInstanceGeneration: "5",
		v1alpha1.LabelInstanceCategory:  "g",
		v1alpha1.LabelAWSInstanceFamily: "g5", v1alpha1.LabelAWSInstanceHypervisor: "nitro", v1alpha1.LabelAWSInstanceGPUName: "a10g",
		v1alpha1.LabelAWSInstanceCPU: "8", v1alpha1.LabelAWSInstanceMemory: "32768",
	}
	for k, v := range want {
		if src.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, src.Labels[k], v)
		}
	}
	if _, ok := src.Labels[v1alpha1.LabelAWSInstanceLocalNVMe]; ok {
		t.Errorf("g5.2xlarge: the name says nothing of local NVMe: the label must be left out")
	}
}
