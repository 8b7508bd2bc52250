package e2e

import (
	"context"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// MachineDeployment mode's launch-failure fallback (issue 16, defects 4
// and 5): a MachineDeployment whose instances cannot be had is noticed
// from its infrastructure machine (CAPA's InstanceReady=False naming
// InsufficientInstanceCapacity, retried, not terminal), its offering left
// out, its replica given back, and the next offering launched within the
// same Create. Each scenario reports its fallback overhead: the time from
// the pods' creation to the creation of the Machine that works, which the
// product owes (the infrastructure's time to boot that Machine is not).

// spotPool is pool with a NodePool that allows spot and on-demand.
func spotPool(t *testing.T, name string) {
	t.Helper()
	pool(t, name)
	ctx := context.Background()
	np := &karpv1.NodePool{}
	if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: name}, np); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(np.DeepCopy())
	for i, r := range np.Spec.Template.Spec.Requirements {
		if r.Key == karpv1.CapacityTypeLabelKey {
			np.Spec.Template.Spec.Requirements[i].Values = []string{karpv1.CapacityTypeSpot, karpv1.CapacityTypeOnDemand}
		}
	}
	if err := w.Spoke.Client.Patch(ctx, np, patch); err != nil {
		t.Fatal(err)
	}
}

// spotMachineDeployment is machineDeployment with a spot AWSMachineTemplate.
func spotMachineDeployment(t *testing.T, pool, name, instanceType, zone string, annotations map[string]string) *clusterv1.MachineDeployment {
	t.Helper()
	ctx := context.Background()
	if _, err := w.CreateAWSMachineTemplate(ctx, name, instanceType, true); err != nil {
		t.Fatalf("creating AWSMachineTemplate %s: %v", name, err)
	}
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: w.Namespace, Name: name, ClusterName: w.ClusterName, Member: true,
		Labels: map[string]string{"pool": pool}, Annotations: annotations, FailureDomain: zone,
	})
	if err := w.Hub.Client.Create(ctx, md); err != nil {
		t.Fatalf("creating MachineDeployment %s: %v", name, err)
	}
	return md
}

// exhaust makes an offering of SimAWS fail with InsufficientInstanceCapacity
// until the test ends.
func exhaust(t *testing.T, instanceType, zone, capacityType string) {
	t.Helper()
	w.AWS.SetInsufficientCapacity(instanceType, zone, capacityType, true)
	t.Cleanup(func() { w.AWS.SetInsufficientCapacity(instanceType, zone, capacityType, false) })
}

// firstBoundMachine waits for the first Machine of md bound to a NodeClaim
// and returns its creation time.
func firstBoundMachine(t *testing.T, timeout time.Duration, md *clusterv1.MachineDeployment) time.Time {
	t.Helper()
	var created []time.Time
	err := WaitFor(context.Background(), timeout, func(ctx context.Context) (bool, error) {
		list := &clusterv1.MachineList{}
		if err := w.Hub.Client.List(ctx, list, client.InNamespace(md.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
			return false, err
		}
		created = created[:0]
		for _, m := range list.Items {
			if m.Annotations[v1alpha1.NodeClaimAnnotation] != "" {
				created = append(created, m.CreationTimestamp.Time)
			}
		}
		return len(created) > 0, nil
	})
	if err != nil {
		t.Fatalf("no Machine of %s bound to a NodeClaim: %v", md.Name, err)
	}
	sort.Slice(created, func(i, j int) bool { return created[i].Before(created[j]) })
	return created[0]
}

// holdsNothing waits until md is back at 0 replicas with no Machine: no
// failed replica is held.
func holdsNothing(t *testing.T, timeout time.Duration, pool, app string, md *clusterv1.MachineDeployment) {
	t.Helper()
	got := waitCounts(t, timeout, pool, app, []*clusterv1.MachineDeployment{md}, func(c counts) bool {
		return c.Replicas == 0 && c.Machines == 0
	})
	t.Logf("%s holds no failed replica: %s", md.Name, got)
}

// apiTime is the wall clock rounded down to the API server's one-second
// creationTimestamp resolution.
func apiTime() time.Time { return time.Now().Truncate(time.Second) }

func TestMachineDeploymentFallsBackWhenTheCheapestNeverLaunches(t *testing.T) {
	pool(t, "mdfb")
	// Instance types no other scenario exhausts: the unavailable
	// offerings are shared by both modes, for the TTL.
	cheap := machineDeployment(t, "mdfb", "mdfb-t3-medium", "t3.medium", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.0416"})
	dear := machineDeployment(t, "mdfb", "mdfb-m5-large", "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	exhaust(t, "t3.medium", "", "")
	start := apiTime()
	deployment(t, "mdfb", "mdfb-app", 2, "1500m")
	created := firstBoundMachine(t, 3*time.Minute, dear)
	overhead := created.Sub(start)
	got := waitCounts(t, 3*time.Minute, "mdfb", "mdfb-app", []*clusterv1.MachineDeployment{cheap, dear}, func(c counts) bool {
		return c.RunningPods == 2 && c.MachineDeploymentReplicas[dear.Name] == 2
	})
	t.Logf("pods running %s after creation, the working Machine made %s after (fallback overhead): %s",
		time.Since(start).Round(time.Second), overhead.Round(time.Second), got)
	if overhead > 30*time.Second {
		t.Errorf("the Machine that works was made %s after the pods, want within 30s", overhead.Round(time.Second))
	}
	holdsNothing(t, time.Minute, "mdfb", "mdfb-app", cheap)
	waitHubEvent(t, "LaunchFailed", "InsufficientInstanceCapacity") // the event says why
}

func TestMachineDeploymentSpotFallsBackToOnDemand(t *testing.T) {
	spotPool(t, "mdspot")
	spot := spotMachineDeployment(t, "mdspot", "mdspot-spot", "m6g.xlarge", "us-east-1a", map[string]string{v1alpha1.SpotPriceAnnotation: "0.05", v1alpha1.PriceAnnotation: "0.05"})
	onDemand := machineDeployment(t, "mdspot", "mdspot-od", "m6g.xlarge", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.154"})
	exhaust(t, "m6g.xlarge", "", world.CapacityTypeSpot)
	start := apiTime()
	deployment(t, "mdspot", "mdspot-app", 1, "1500m")
	created := firstBoundMachine(t, 3*time.Minute, onDemand)
	overhead := created.Sub(start)
	nodes := waitAppNodes(t, 3*time.Minute, "mdspot-app", 1)
	if got := nodes[0].Labels[karpv1.CapacityTypeLabelKey]; got != karpv1.CapacityTypeOnDemand {
		t.Fatalf("with spot exhausted the node is %s, want on-demand", got)
	}
	t.Logf("on-demand node after %s, its Machine made %s after the pod (fallback overhead)", time.Since(start).Round(time.Second), overhead.Round(time.Second))
	if overhead > 30*time.Second {
		t.Errorf("the on-demand Machine was made %s after the pod, want within 30s", overhead.Round(time.Second))
	}
	holdsNothing(t, time.Minute, "mdspot", "mdspot-app", spot)
}

func TestMachineDeploymentThreeOfFourOfferingsExhausted(t *testing.T) {
	spotPool(t, "md3of4")
	// One instance type, four offerings; the three cheapest are exhausted.
	mds := []*clusterv1.MachineDeployment{
		spotMachineDeployment(t, "md3of4", "md3of4-spot-a", "g4dn.xlarge", "us-east-1a", map[string]string{v1alpha1.SpotPriceAnnotation: "0.16", v1alpha1.PriceAnnotation: "0.16"}),
		machineDeployment(t, "md3of4", "md3of4-od-a", "g4dn.xlarge", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.526"}),
		machineDeployment(t, "md3of4", "md3of4-od-b", "g4dn.xlarge", "us-east-1b", map[string]string{v1alpha1.PriceAnnotation: "0.527"}),
		machineDeployment(t, "md3of4", "md3of4-od-c", "g4dn.xlarge", "us-east-1c", map[string]string{v1alpha1.PriceAnnotation: "0.528"}),
	}
	exhaust(t, "g4dn.xlarge", "", world.CapacityTypeSpot)
	exhaust(t, "g4dn.xlarge", "us-east-1a", world.CapacityTypeOnDemand)
	exhaust(t, "g4dn.xlarge", "us-east-1b", world.CapacityTypeOnDemand)
	start := apiTime()
	report := fallbackTimeline(time.Now(), mds...)
	podDeployment(t, "md3of4", "md3of4-app", 1, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")}, nil)
	created := firstBoundMachine(t, 3*time.Minute, mds[3])
	overhead := created.Sub(start)
	defer func() { t.Logf("where the time went (seconds after the pod, seen every 200 ms):%s", report()) }()
	nodes := waitAppNodes(t, 3*time.Minute, "md3of4-app", 1)
	if got := nodes[0].Labels[corev1.LabelTopologyZone]; got != "us-east-1c" {
		t.Fatalf("the node is in %s, want us-east-1c (the only offering left)", got)
	}
	// Each exhausted offering costs a round of Cluster API (replicas raised,
	// the MachineSet makes a Machine and its AWSMachine) and of the
	// infrastructure (the launch fails) before the next is tried: issue
	// 19's target of 10 s over three of them is measured by
	// BenchmarkFallback (make bench); here 30 s, issue 16's bound for one
	// fallback, is the failure bound.
	t.Logf("node after %s, its Machine made %s after the pod (fallback overhead over 3 exhausted offerings; target 10s)",
		time.Since(start).Round(time.Second), overhead.Round(time.Second))
	if overhead > 30*time.Second {
		t.Errorf("the Machine that works was made %s after the pod, want within 30s", overhead.Round(time.Second))
	}
	for _, md := range mds[:3] {
		holdsNothing(t, time.Minute, "md3of4", "md3of4-app", md)
	}
}
