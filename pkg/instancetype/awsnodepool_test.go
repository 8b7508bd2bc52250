package instancetype

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/controllers/provisioning/scheduling"
	"sigs.k8s.io/yaml"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// awsCatalogue is a fleet of AWSMachineTemplates as a CAPA user has them:
// spec.template.spec.instanceType, status.capacity as CAPA fills it (cpu and
// memory only), status.nodeInfo, a price and, for some, a spot price.
// What a real user's templates may add: GPU and ephemeral-disk capacity
// annotations (covered by p3, g5 and m5d below); what they lack: anything
// about network or EBS bandwidth (not derivable, not published).
var awsCatalogue = []struct {
	name, cpu, memory, arch string
	ann                     map[string]string
}{
	{"t3.nano", "2", "512Mi", "amd64", nil},
	{"t3.micro", "2", "1Gi", "amd64", nil},
	{"t3.large", "2", "8Gi", "amd64", nil},
	{"m4.large", "2", "8Gi", "amd64", nil},
	{"m5.large", "2", "8Gi", "amd64", spot},
	{"m5.xlarge", "4", "16Gi", "amd64", spot},
	{"m5d.2xlarge", "8", "32Gi", "amd64", map[string]string{"capacity.cluster-autoscaler.kubernetes.io/ephemeral-disk": "300Gi"}},
	{"m5.metal", "96", "384Gi", "amd64", nil},
	{"c5.xlarge", "4", "8Gi", "amd64", spot},
	{"c6g.large", "2", "4Gi", "arm64", spot},
	{"c7i.large", "2", "4Gi", "amd64", nil},
	{"r5.large", "2", "16Gi", "amd64", nil},
	{"r6gd.xlarge", "4", "32Gi", "arm64", spot},
	{"r7i.2xlarge", "8", "64Gi", "amd64", nil},
	{"m6i.large", "2", "8Gi", "amd64", spot},
	{"m7g.medium", "1", "4Gi", "arm64", nil},
	{"p3.2xlarge", "8", "61Gi", "amd64", gpus(1)},
	{"g5.xlarge", "4", "16Gi", "amd64", gpus(1)},
	{"i3.large", "2", "15616Mi", "amd64", nil},
	{"inf2.xlarge", "4", "16Gi", "amd64", nil},
}

var spot = map[string]string{v1alpha1.SpotPriceAnnotation: "0.03"}

func gpus(n int) map[string]string {
	return map[string]string{"capacity.cluster-autoscaler.kubernetes.io/gpu-count": fmt.Sprint(n)}
}

func awsInstanceTypes(t *testing.T) []*cloudprovider.InstanceType {
	t.Helper()
	var sources []Source
	for _, c := range awsCatalogue {
		ann := map[string]string{v1alpha1.PriceAnnotation: "0.1"}
		for k, v := range c.ann {
			ann[k] = v
		}
		tmpl := awsTemplate(c.name, false, map[string]any{"cpu": c.cpu, "memory": c.memory}, ann)
		tmpl.SetName(strings.ReplaceAll(c.name, ".", "-"))
		_ = unstructured.SetNestedField(tmpl.Object, c.arch, "status", "nodeInfo", "architecture")
		srcs := FromTemplate(tmpl, TemplateOptions{ClusterName: "c", Zones: []string{"us-east-1a", "us-east-1b"}, SpotCapable: true})
		for _, s := range srcs {
			if s.Err != nil {
				t.Fatalf("%s: %v", c.name, s.Err)
			}
		}
		sources = append(sources, srcs...)
	}
	return Build(sources).InstanceTypes
}

// selected is what Karpenter core's scheduler keeps of a NodePool's
// instance types before it looks at pods (scheduling.NewScheduler: the
// NodeClaimTemplate's requirements intersect the type's requirements, and
// some available offering is compatible), then minValues.
func selected(t *testing.T, np *karpv1.NodePool, its []*cloudprovider.InstanceType) []string {
	t.Helper()
	reqs := scheduling.NewNodeClaimTemplate(np).Requirements
	var out cloudprovider.InstanceTypes
	for _, it := range its {
		if it.Requirements.Intersects(reqs) == nil && it.Offerings.Available().HasCompatible(reqs) {
			out = append(out, it)
		}
	}
	if reqs.HasMinValues() {
		if _, _, err := out.SatisfiesMinValues(reqs); err != nil {
			t.Logf("NodePool %s: minValues not satisfied: %v", np.Name, err)
			return nil
		}
	}
	names := make([]string, 0, len(out))
	for _, it := range out {
		names = append(names, it.Name)
	}
	slices.Sort(names)
	return names
}

func nodePool(t *testing.T, name, requirements string) *karpv1.NodePool {
	t.Helper()
	doc := fmt.Sprintf(`
apiVersion: karpenter.sh/v1
kind: NodePool
metadata: {name: %s}
spec:
  template:
    spec:
      nodeClassRef: {group: karpenter.cluster.x-k8s.io, kind: ClusterAPINodeClass, name: default}
      requirements:
%s`, name, requirements)
	np := &karpv1.NodePool{}
	if err := yaml.UnmarshalStrict([]byte(doc), np); err != nil {
		t.Fatalf("NodePool %s: %v", name, err)
	}
	return np
}

// NodePools as the AWS provider's documentation writes them select the
// instance types an AWS user expects, through core's own requirement code.
func TestAWSNodePoolsSelectWhatTheySelectOnAWS(t *testing.T) {
	its := awsInstanceTypes(t)
	cases := []struct {
		name, requirements string
		want               []string
	}{
		{"getting-started", `
      - {key: kubernetes.io/arch, operator: In, values: [amd64]}
      - {key: kubernetes.io/os, operator: In, values: [linux]}
      - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}
      - {key: karpenter.k8s.aws/instance-category, operator: In, values: [c, m, r]}
      - {key: karpenter.k8s.aws/instance-generation, operator: Gt, values: ["2"]}`,
			[]string{"c5.xlarge", "c7i.large", "m4.large", "m5.large", "m5.metal", "m5.xlarge", "m5d.2xlarge", "m6i.large", "r5.large", "r7i.2xlarge"}},
		{"recent-cmr-spot-and-on-demand", `
      - {key: karpenter.k8s.aws/instance-category, operator: In, values: [c, m, r]}
      - {key: karpenter.k8s.aws/instance-generation, operator: Gt, values: ["5"]}
      - {key: karpenter.k8s.aws/instance-size, operator: NotIn, values: [nano, micro]}
      - {key: karpenter.sh/capacity-type, operator: In, values: [spot, on-demand]}`,
			[]string{"c6g.large", "c7i.large", "m6i.large", "m7g.medium", "r6gd.xlarge", "r7i.2xlarge"}},
		{"spot-only", `
      - {key: karpenter.k8s.aws/instance-category, operator: In, values: [c, m, r]}
      - {key: karpenter.sh/capacity-type, operator: In, values: [spot]}`,
			[]string{"c5.xlarge", "c6g.large", "m5.large", "m5.xlarge", "m6i.large", "r6gd.xlarge"}},
		{"no-small-sizes-nitro-cpu", `
      - {key: karpenter.k8s.aws/instance-size, operator: NotIn, values: [nano, micro, small, medium, large]}
      - {key: karpenter.k8s.aws/instance-cpu, operator: In, values: ["4", "8", "16", "32"]}
      - {key: karpenter.k8s.aws/instance-hypervisor, operator: In, values: [nitro]}`,
			[]string{"c5.xlarge", "g5.xlarge", "inf2.xlarge", "m5.xlarge", "m5d.2xlarge", "r6gd.xlarge", "r7i.2xlarge"}},
		{"gpu", `
      - {key: karpenter.k8s.aws/instance-gpu-name, operator: In, values: [t4, a10g]}`,
			[]string{"g5.xlarge"}},
		{"any-gpu", `
      - {key: karpenter.k8s.aws/instance-gpu-count, operator: Gt, values: ["0"]}`,
			[]string{"g5.xlarge", "p3.2xlarge"}},
		{"no-gpu-memory-over-16g", `
      - {key: karpenter.k8s.aws/instance-gpu-count, operator: DoesNotExist}
      - {key: karpenter.k8s.aws/instance-memory, operator: Gt, values: ["16384"]}
      - {key: karpenter.k8s.aws/instance-category, operator: NotIn, values: [t]}`,
			[]string{"m5.metal", "m5d.2xlarge", "r6gd.xlarge", "r7i.2xlarge"}},
		{"local-nvme", `
      - {key: karpenter.k8s.aws/instance-local-nvme, operator: Gt, values: ["100"]}`,
			[]string{"m5d.2xlarge"}},
		{"family-with-min-values", `
      - {key: karpenter.k8s.aws/instance-family, operator: In, values: [m5, c5, r5], minValues: 3}`,
			[]string{"c5.xlarge", "m5.large", "m5.metal", "m5.xlarge", "r5.large"}},
		{"family-min-values-unmet", `
      - {key: karpenter.k8s.aws/instance-family, operator: In, values: [m5, c5, x2], minValues: 3}`,
			nil},
		{"provider-domain-labels", `
      - {key: karpenter.cluster.x-k8s.io/instance-category, operator: In, values: [m]}
      - {key: karpenter.cluster.x-k8s.io/instance-generation, operator: Lt, values: ["6"]}
      - {key: karpenter.cluster.x-k8s.io/instance-memory, operator: Lt, values: ["20000"]}`,
			[]string{"m4.large", "m5.large", "m5.xlarge"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			np := nodePool(t, c.name, c.requirements)
			if err := np.RuntimeValidate(context.Background()); err != nil {
				t.Fatalf("core rejects the NodePool: %v", err)
			}
			if got := selected(t, np, its); !slices.Equal(got, c.want) {
				t.Errorf("selected %v, want %v", got, c.want)
			}
		})
	}
}

// A NodePool asking for an AWS label that cannot be derived is reported by
// core's validation, naming the label, instead of matching silently.
func TestUnderivableAWSLabelIsReportedByCore(t *testing.T) {
	np := nodePool(t, "bandwidth", `
      - {key: karpenter.k8s.aws/instance-network-bandwidth, operator: Gt, values: ["1000"]}`)
	err := np.RuntimeValidate(context.Background())
	if err == nil || !strings.Contains(err.Error(), "karpenter.k8s.aws/instance-network-bandwidth") {
		t.Fatalf("want core's validation to name the label, got %v", err)
	}
}

// Instance types that do not come from CAPA carry no AWS labels, so a
// NodePool written for AWS does not select them; their provider-domain
// labels follow the name's scheme.
func TestNonAWSTemplatesCarryOnlyProviderLabels(t *testing.T) {
	var sources []Source
	for _, name := range []string{"Standard_D4s_v5", "n2-standard-4"} {
		tmpl := awsTemplate(name, false, map[string]any{"cpu": "4", "memory": "16Gi"}, nil)
		tmpl.SetKind("AzureMachineTemplate")
		tmpl.SetName(strings.ToLower(strings.ReplaceAll(name, "_", "-")))
		sources = append(sources, FromTemplate(tmpl, TemplateOptions{ClusterName: "c"})...)
	}
	its := Build(sources).InstanceTypes
	aws := nodePool(t, "aws", `
      - {key: karpenter.k8s.aws/instance-cpu, operator: In, values: ["4"]}`)
	if got := selected(t, aws, its); len(got) != 0 {
		t.Errorf("an AWS NodePool selected %v", got)
	}
	generic := nodePool(t, "generic", `
      - {key: karpenter.cluster.x-k8s.io/instance-cpu, operator: In, values: ["4"]}
      - {key: karpenter.cluster.x-k8s.io/instance-generation, operator: Gt, values: ["3"]}`)
	if got := selected(t, generic, its); !slices.Equal(got, []string{"Standard_D4s_v5"}) {
		t.Errorf("selected %v, want Standard_D4s_v5 (n2 is generation 2)", got)
	}
}
