package e2ecapa

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/world/ec2sim"
)

// Machine mode with the real CAPA: pending pods get nodes from CAPA's
// published worker template (AMI looked up by Kubernetes version, bootstrap
// data through Secrets Manager), each Node the instance of its Machine;
// scaling down terminates the instances of the removed nodes, scaling to
// zero every one.
func TestMachineModeScaleUpAndDown(t *testing.T) {
	t.Parallel()
	const pool = "mscale"
	machineModePool(t, pool)
	memberTemplate(t, pool, pool+"-m5-large", "m5.large", capacityAnnotations("m5.large", map[string]string{v1alpha1.PriceAnnotation: "0.096"}), nil)

	d := app(t, pool, pool, 3, "1500m")
	v := waitView(t, 3*time.Minute, pool, pool, func(v view) bool {
		return v.RunningPods == 3 && len(v.Nodes) == 3 && len(v.Machines) == 3 && len(v.Instances) == 3
	})
	checkIdentity(t, v)

	scale(t, d, 1)
	v = waitView(t, 3*time.Minute, pool, pool, func(v view) bool {
		return v.RunningPods == 1 && len(v.Nodes) == 1 && len(v.Machines) == 1 && len(v.Instances) == 1
	})
	checkIdentity(t, v)
	scaleToZeroAndCheckNothingLeaks(t, d, pool)
}

// Machine mode: an instance type EC2 has no capacity for in the cheapest
// zone. CAPA reports RunInstances' InsufficientInstanceCapacity on the
// AWSMachine; the provider removes that Machine, leaves the offering out,
// and the pod gets a node of the same type in another zone.
func TestMachineModeInsufficientCapacityFallsBackToAnotherZone(t *testing.T) {
	t.Parallel()
	const pool = "mice"
	machineModePool(t, pool)
	// us-east-1a is the cheapest zone: the first launch goes there.
	memberTemplate(t, pool, pool+"-c5-large", "c5.large", capacityAnnotations("c5.large", map[string]string{
		v1alpha1.PriceAnnotation: "0.085", v1alpha1.PriceAnnotation + ".us-east-1a": "0.080",
	}), nil)
	limitCapacity(t, ec2sim.Pool{InstanceType: "c5.large", Zone: "us-east-1a"}, 0)
	before := launchErrors("InsufficientInstanceCapacity", "c5.large")
	reports := recordCAPAReports(t, pool)

	d := app(t, pool, pool, 1, "1500m")
	v := waitView(t, 3*time.Minute, pool, pool, func(v view) bool {
		return v.RunningPods == 1 && len(v.Nodes) == 1 && len(v.Machines) == 1 && len(v.Instances) == 1
	})
	checkIdentity(t, v)
	if z := v.Nodes[0].Labels[corev1.LabelTopologyZone]; z == "us-east-1a" {
		t.Fatalf("the node is in %s, where c5.large is exhausted", z)
	}
	if launchErrors("InsufficientInstanceCapacity", "c5.large") == before {
		t.Fatal("EC2 refused no launch: the scenario did not exercise the fallback")
	}
	checkCAPAReportedLaunchFailure(t, reports(), "InsufficientInstanceCapacity")
	waitUnavailableOffering(t, pool, "c5.large", "us-east-1a", karpv1.CapacityTypeOnDemand)
	scaleToZeroAndCheckNothingLeaks(t, d, pool)
}
