package e2ecapa

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/e2e"
	"github.com/autonode/karpenter-clusterapi/test/world/ec2sim"
)

// mdTemplate creates a template from CAPA's published worker template for
// MachineDeployments (no capacity annotations: CAPA describes the instance
// type once a MachineDeployment made the Cluster the template's owner).
func mdTemplate(t testing.TB, pool, name, instanceType string, mutate func(*infrav1.AWSMachineSpec)) *infrav1.AWSMachineTemplate {
	t.Helper()
	tmpl := publishedWorkerTemplate(t, name, instanceType)
	if mutate != nil {
		mutate(&tmpl.Spec.Template.Spec)
	}
	return createTemplate(t, tmpl, map[string]string{"pool": pool}, nil)
}

// waitCAPADescribed waits until CAPA's AWSMachineTemplate controller wrote
// the template's status from DescribeInstanceTypes (and the AMI it looks
// up) and checks it against the EC2 catalogue: what the provider reads as
// the instance type's capacity when no annotation overrides it. os is the
// operating system CAPA reads from the AMI; it finds the AMI only through a
// MachineDeployment's or MachineSet's Kubernetes version, so for a template
// only Machine mode uses it writes the architecture alone (os "").
func waitCAPADescribed(t testing.TB, tmpl *infrav1.AWSMachineTemplate, cpu, memory, arch string, os infrav1.OperatingSystem) {
	t.Helper()
	cur := &infrav1.AWSMachineTemplate{}
	err := e2e.WaitFor(context.Background(), time.Minute, func(ctx context.Context) (bool, error) {
		if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(tmpl), cur); err != nil {
			return false, err
		}
		return len(cur.Status.Capacity) > 0 && cur.Status.NodeInfo != nil && cur.Status.NodeInfo.Architecture != "" &&
			(os == "" || cur.Status.NodeInfo.OperatingSystem != ""), nil
	})
	if err != nil {
		t.Fatalf("CAPA did not describe AWSMachineTemplate %s: status %+v", tmpl.Name, cur.Status)
	}
	t.Logf("CAPA wrote AWSMachineTemplate %s status: capacity %v, nodeInfo %+v", tmpl.Name, cur.Status.Capacity, *cur.Status.NodeInfo)
	if q := cur.Status.Capacity[corev1.ResourceCPU]; q.Cmp(resource.MustParse(cpu)) != 0 {
		t.Errorf("status.capacity cpu %s, want %s", q.String(), cpu)
	}
	if q := cur.Status.Capacity[corev1.ResourceMemory]; q.Cmp(resource.MustParse(memory)) != 0 {
		t.Errorf("status.capacity memory %s, want %s", q.String(), memory)
	}
	if string(cur.Status.NodeInfo.Architecture) != arch || cur.Status.NodeInfo.OperatingSystem != os {
		t.Errorf("status.nodeInfo %+v, want %s/%q", *cur.Status.NodeInfo, arch, os)
	}
}

// MachineDeployment mode with the real CAPA: CAPA describes the template
// (capacity and architecture in its status, nothing annotated), pending
// pods raise the replicas, every Node is its Machine's instance; scaling
// down gives the replicas back and terminates the instances.
func TestMachineDeploymentModeScaleUpAndDown(t *testing.T) {
	t.Parallel()
	const pool = "dscale"
	machineDeploymentPool(t, pool)
	tmpl := mdTemplate(t, pool, pool+"-t3-medium", "t3.medium", nil)
	md := memberMachineDeployment(t, pool, pool+"-a", tmpl.Name, "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.0416"})
	waitCAPADescribed(t, tmpl, "2", "4Gi", "amd64", infrav1.OperatingSystemLinux)

	d := app(t, pool, pool, 3, "1500m")
	v := waitView(t, 3*time.Minute, pool, pool, func(v view) bool {
		return v.RunningPods == 3 && len(v.Nodes) == 3 && len(v.Machines) == 3 && len(v.Instances) == 3
	})
	checkIdentity(t, v)
	checkReplicas(t, md, 3)

	scale(t, d, 1)
	v = waitView(t, 3*time.Minute, pool, pool, func(v view) bool {
		return v.RunningPods == 1 && len(v.Nodes) == 1 && len(v.Machines) == 1 && len(v.Instances) == 1
	})
	checkIdentity(t, v)
	scaleToZeroAndCheckNothingLeaks(t, d, pool)
	checkReplicas(t, md, 0)
}

// checkReplicas waits until the MachineDeployment has the replicas.
func checkReplicas(t testing.TB, md *clusterv1.MachineDeployment, want int32) {
	t.Helper()
	cur := &clusterv1.MachineDeployment{}
	err := e2e.WaitFor(context.Background(), time.Minute, func(ctx context.Context) (bool, error) {
		if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
			return false, err
		}
		return cur.Spec.Replicas != nil && *cur.Spec.Replicas == want, nil
	})
	if err != nil {
		t.Errorf("MachineDeployment %s: replicas %v, want %d", md.Name, cur.Spec.Replicas, want)
	}
}

// MachineDeployment mode: the cheapest MachineDeployment's zone has no
// capacity for its instance type. CAPA reports RunInstances'
// InsufficientInstanceCapacity on the AWSMachine; the NodeClaim gets a node
// from the next offering (another MachineDeployment of the type, in another
// zone) and the failed replica is given back.
func TestMachineDeploymentModeInsufficientCapacityFallsBack(t *testing.T) {
	t.Parallel()
	const pool = "dice"
	machineDeploymentPool(t, pool)
	tmpl := mdTemplate(t, pool, pool+"-m6g-xlarge", "m6g.xlarge", nil)
	cheap := memberMachineDeployment(t, pool, pool+"-a", tmpl.Name, "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.10"})
	other := memberMachineDeployment(t, pool, pool+"-b", tmpl.Name, "us-east-1b", map[string]string{v1alpha1.PriceAnnotation: "0.154"})
	waitCAPADescribed(t, tmpl, "4", "16Gi", "arm64", infrav1.OperatingSystemLinux)
	limitCapacity(t, ec2sim.Pool{InstanceType: "m6g.xlarge", Zone: "us-east-1a"}, 0)
	reports := recordCAPAReports(t, pool)

	d := app(t, pool, pool, 1, "3")
	v := waitView(t, 4*time.Minute, pool, pool, func(v view) bool {
		return v.RunningPods == 1 && len(v.Nodes) == 1 && len(v.Machines) == 1 && len(v.Instances) == 1
	})
	checkIdentity(t, v)
	if z := v.Nodes[0].Labels[corev1.LabelTopologyZone]; z != "us-east-1b" {
		t.Fatalf("the node is in %s, want us-east-1b (m6g.xlarge is exhausted in us-east-1a)", z)
	}
	if launchErrors("InsufficientInstanceCapacity", "m6g.xlarge") == 0 {
		t.Fatal("EC2 refused no launch: the scenario did not exercise the fallback")
	}
	checkCAPAReportedLaunchFailure(t, reports(), "InsufficientInstanceCapacity")
	checkReplicas(t, cheap, 0)
	checkReplicas(t, other, 1)
	scaleToZeroAndCheckNothingLeaks(t, d, pool)
	checkReplicas(t, other, 0)
}

// MachineDeployment mode: the spot MachineDeployment is cheaper but EC2 has
// no spot capacity; the pod gets a node from the on-demand one.
func TestMachineDeploymentModeSpotExhaustedFallsBackToOnDemand(t *testing.T) {
	fullSuite(t)
	t.Parallel()
	const pool = "dspot"
	machineDeploymentPool(t, pool, karpv1.CapacityTypeSpot, karpv1.CapacityTypeOnDemand)
	spot := mdTemplate(t, pool, pool+"-spot", "m5.2xlarge", func(s *infrav1.AWSMachineSpec) { s.SpotMarketOptions = &infrav1.SpotMarketOptions{} })
	onDemand := mdTemplate(t, pool, pool+"-od", "m5.2xlarge", nil)
	spotMD := memberMachineDeployment(t, pool, pool+"-spot", spot.Name, "us-east-1a", map[string]string{v1alpha1.SpotPriceAnnotation: "0.12"})
	memberMachineDeployment(t, pool, pool+"-od", onDemand.Name, "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.384"})
	limitCapacity(t, ec2sim.Pool{InstanceType: "m5.2xlarge", Market: ec2sim.Spot}, 0)
	reports := recordCAPAReports(t, pool)

	d := app(t, pool, pool, 1, "6")
	v := waitView(t, 4*time.Minute, pool, pool, func(v view) bool {
		return v.RunningPods == 1 && len(v.Nodes) == 1 && len(v.Machines) == 1 && len(v.Instances) == 1
	})
	checkIdentity(t, v)
	if ct := v.Nodes[0].Labels[karpv1.CapacityTypeLabelKey]; ct != karpv1.CapacityTypeOnDemand {
		t.Fatalf("the node is %s; EC2 has no spot capacity", ct)
	}
	checkCAPAReportedLaunchFailure(t, reports(), "InsufficientInstanceCapacity")
	checkReplicas(t, spotMD, 0)
	scaleToZeroAndCheckNothingLeaks(t, d, pool)
}

// MachineDeployment mode: EC2 interrupts a spot instance; Karpenter
// replaces the node, the interrupted Machine goes, nothing leaks.
func TestMachineDeploymentModeSpotInterruptionIsReplaced(t *testing.T) {
	fullSuite(t)
	t.Parallel()
	const pool = "dint"
	machineDeploymentPool(t, pool, karpv1.CapacityTypeSpot)
	tmpl := mdTemplate(t, pool, pool+"-m6g-large", "m6g.large", func(s *infrav1.AWSMachineSpec) { s.SpotMarketOptions = &infrav1.SpotMarketOptions{} })
	md := memberMachineDeployment(t, pool, pool+"-a", tmpl.Name, "us-east-1b", map[string]string{v1alpha1.SpotPriceAnnotation: "0.03"})

	d := app(t, pool, pool, 2, "1500m")
	v := waitView(t, 3*time.Minute, pool, pool, func(v view) bool {
		// The victim's Machine is found by its providerID, which Cluster
		// API copies once CAPA reports the instance provisioned.
		return v.RunningPods == 2 && len(v.Nodes) == 2 && len(v.Machines) == 2 && len(v.Instances) == 2 && copied(v)
	})
	checkIdentity(t, v)
	victim := v.Nodes[0]
	_, id, _ := strings.Cut(strings.TrimPrefix(victim.Spec.ProviderID, "aws:///"), "/")
	if err := w.EC2.Interrupt(id); err != nil {
		t.Fatal(err)
	}
	v = waitView(t, 4*time.Minute, pool, pool, func(v view) bool {
		if v.RunningPods != 2 || len(v.Nodes) != 2 || len(v.Machines) != 2 || len(v.Deleting) != 0 || len(v.Instances) != 2 {
			return false
		}
		for _, m := range v.Machines {
			if m.Spec.ProviderID == victim.Spec.ProviderID {
				return false
			}
		}
		return true
	})
	checkIdentity(t, v)
	checkReplicas(t, md, 2)
	scaleToZeroAndCheckNothingLeaks(t, d, pool)
	checkReplicas(t, md, 0)
}

// MachineDeployment mode: the MachineDeployment moves to a new template (an
// AWSMachineTemplate's spec is immutable); with OnDelete, Cluster API makes
// no Machines of its own and Karpenter replaces every node as drifted.
func TestMachineDeploymentModeTemplateChangeIsDriftAndRolled(t *testing.T) {
	fullSuite(t)
	t.Parallel()
	ctx := context.Background()
	const pool = "ddrift"
	machineDeploymentPool(t, pool)
	v1 := mdTemplate(t, pool, pool+"-v1", "m5.large", nil)
	md := memberMachineDeployment(t, pool, pool+"-a", v1.Name, "us-east-1c", map[string]string{v1alpha1.PriceAnnotation: "0.096"})

	d := app(t, pool, pool, 2, "1500m")
	v := waitView(t, 3*time.Minute, pool, pool, func(v view) bool {
		return v.RunningPods == 2 && len(v.Nodes) == 2 && len(v.Machines) == 2 && len(v.Instances) == 2
	})
	checkIdentity(t, v)
	old := map[string]bool{}
	for _, in := range v.Instances {
		old[in.ID] = true
	}

	v2 := mdTemplate(t, pool, pool+"-v2", "m5.large", func(s *infrav1.AWSMachineSpec) {
		s.InstanceMetadataOptions = &infrav1.InstanceMetadataOptions{HTTPTokens: infrav1.HTTPTokensStateRequired,
			HTTPEndpoint: infrav1.InstanceMetadataEndpointStateEnabled, HTTPPutResponseHopLimit: 2, InstanceMetadataTags: infrav1.InstanceMetadataEndpointStateDisabled}
	})
	cur := &clusterv1.MachineDeployment{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	cur.Spec.Template.Spec.InfrastructureRef.Name = v2.Name
	if err := w.Hub.Client.Patch(ctx, cur, patch); err != nil {
		t.Fatal(err)
	}
	v = waitView(t, 5*time.Minute, pool, pool, func(v view) bool {
		if v.RunningPods != 2 || len(v.Nodes) != 2 || len(v.Machines) != 2 || len(v.Instances) != 2 {
			return false
		}
		for _, in := range v.Instances {
			if old[in.ID] || in.HTTPTokens != "required" {
				return false
			}
		}
		return true
	})
	checkIdentity(t, v)
	checkReplicas(t, md, 2)
	scaleToZeroAndCheckNothingLeaks(t, d, pool)
}
