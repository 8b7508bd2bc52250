package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// A NodePool written the way the AWS provider's documentation writes one
// (instance category and generation, sizes excluded, spot and on-demand)
// launches, over AWSMachineTemplates, the instance type it would on AWS:
// m6i.large, the only recent c/m/r type that fits, although the older m5 and
// c5 are cheaper; the Node carries the AWS and provider-domain labels.
func TestAWSWrittenNodePoolLaunchesWhatAWSWould(t *testing.T) {
	ctx := context.Background()
	machinePool(t, "awsnp", machinePoolOptions{})
	var reqs []karpv1.NodeSelectorRequirementWithMinValues
	if err := yaml.Unmarshal([]byte(`
- {key: kubernetes.io/arch, operator: In, values: [amd64]}
- {key: kubernetes.io/os, operator: In, values: [linux]}
- {key: karpenter.sh/capacity-type, operator: In, values: [spot, on-demand]}
- {key: karpenter.k8s.aws/instance-category, operator: In, values: [c, m, r]}
- {key: karpenter.k8s.aws/instance-generation, operator: Gt, values: ["5"]}
- {key: karpenter.k8s.aws/instance-size, operator: NotIn, values: [nano, micro]}
`), &reqs); err != nil {
		t.Fatal(err)
	}
	updateNodePool(t, "awsnp", func(np *karpv1.NodePool) { np.Spec.Template.Spec.Requirements = reqs })
	memberTemplate(t, "awsnp", "awsnp-c5-large", "c5.large", map[string]string{v1alpha1.PriceAnnotation: "0.085"})
	memberTemplate(t, "awsnp", "awsnp-m5-large", "m5.large", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	memberTemplate(t, "awsnp", "awsnp-m6i-large", "m6i.large", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	memberTemplate(t, "awsnp", "awsnp-m6g-large", "m6g.large", map[string]string{v1alpha1.PriceAnnotation: "0.077"})

	workload(t, "awsnp", "awsnp-app", 1, "1", "", nil)
	nodes := waitAppNodes(t, 3*time.Minute, "awsnp-app", 1)
	n := nodes[0]
	want := map[string]string{
		corev1.LabelInstanceTypeStable:      "m6i.large",
		v1alpha1.LabelAWSInstanceCategory:   "m",
		v1alpha1.LabelAWSInstanceFamily:     "m6i",
		v1alpha1.LabelAWSInstanceGeneration: "6",
		v1alpha1.LabelAWSInstanceSize:       "large",
		v1alpha1.LabelAWSInstanceCPU:        "2",
		v1alpha1.LabelAWSInstanceMemory:     "8192",
		v1alpha1.LabelAWSInstanceHypervisor: "nitro",
		v1alpha1.LabelInstanceCategory:      "m",
		v1alpha1.LabelInstanceGeneration:    "6",
		v1alpha1.LabelInstanceCPU:           "2",
		v1alpha1.LabelInstanceMemory:        "8192",
	}
	for k, v := range want {
		if n.Labels[k] != v {
			t.Errorf("Node %s: label %s = %q, want %q", n.Name, k, n.Labels[k], v)
		}
	}
	// Where a user looks: the NodeClaim shows type, capacity type, zone and
	// image, and its Launched event names the Machine and the template.
	nc := nodeClaimOfNode(t, n.Name)
	if nc.Labels[corev1.LabelTopologyZone] == "" || nc.Labels[karpv1.CapacityTypeLabelKey] != karpv1.CapacityTypeOnDemand || nc.Status.ImageID != world.DefaultAMI {
		t.Errorf("NodeClaim %s: zone %q, capacity type %q, image %q", nc.Name, nc.Labels[corev1.LabelTopologyZone], nc.Labels[karpv1.CapacityTypeLabelKey], nc.Status.ImageID)
	}
	err := WaitFor(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
		events := &corev1.EventList{}
		if err := w.Spoke.Client.List(ctx, events); err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.InvolvedObject.Kind == "NodeClaim" && e.InvolvedObject.Name == nc.Name && e.Reason == "Launched" &&
				strings.Contains(e.Message, nc.Annotations[v1alpha1.MachineAnnotation]) && strings.Contains(e.Message, "from AWSMachineTemplate "+w.Namespace+"/awsnp-m6i-large") {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("no Launched event on NodeClaim %s naming its Machine %s and template: %v", nc.Name, nc.Annotations[v1alpha1.MachineAnnotation], err)
	}
	// Core accepted the NodePool as valid (the labels are well known).
	np := &karpv1.NodePool{}
	if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: "awsnp"}, np); err != nil {
		t.Fatal(err)
	}
	if c := np.StatusConditions().Get(karpv1.ConditionTypeValidationSucceeded); c == nil || !c.IsTrue() {
		t.Errorf("NodePool awsnp ValidationSucceeded = %v", c)
	}
}
