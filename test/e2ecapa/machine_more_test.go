package e2ecapa

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/e2e"
	"github.com/autonode/karpenter-clusterapi/test/world/ec2sim"
)

// Machine mode: spot is cheaper but EC2 has no spot capacity for the type;
// CAPA reports the refused spot request, and the pod gets an on-demand node
// of the same type.
func TestMachineModeSpotExhaustedFallsBackToOnDemand(t *testing.T) {
	fullSuite(t)
	t.Parallel()
	const pool = "mspot"
	machineModePool(t, pool, karpv1.CapacityTypeSpot, karpv1.CapacityTypeOnDemand)
	memberTemplate(t, pool, pool+"-m5-xlarge", "m5.xlarge", capacityAnnotations("m5.xlarge", map[string]string{
		v1alpha1.PriceAnnotation: "0.192", v1alpha1.SpotPriceAnnotation: "0.07",
	}), nil)
	limitCapacity(t, ec2sim.Pool{InstanceType: "m5.xlarge", Market: ec2sim.Spot}, 0)
	reports := recordCAPAReports(t, pool)

	d := app(t, pool, pool, 1, "3")
	v := waitView(t, 3*time.Minute, pool, pool, func(v view) bool {
		return v.RunningPods == 1 && len(v.Nodes) == 1 && len(v.Machines) == 1 && len(v.Instances) == 1
	})
	checkIdentity(t, v)
	if ct := v.Nodes[0].Labels[karpv1.CapacityTypeLabelKey]; ct != karpv1.CapacityTypeOnDemand {
		t.Fatalf("the node is %s; EC2 has no spot capacity", ct)
	}
	checkCAPAReportedLaunchFailure(t, reports(), "InsufficientInstanceCapacity")
	waitUnavailableOffering(t, pool, "m5.xlarge", "", karpv1.CapacityTypeSpot)
	scaleToZeroAndCheckNothingLeaks(t, d, pool)
}

// Machine mode: a template that asks for spot with a maximum price below
// the current spot price. EC2 answers SpotMaxPriceTooLow (a client error,
// not retried); the provider treats it as no capacity at that price and
// launches from the on-demand template of the same type.
func TestMachineModeSpotMaxPriceTooLowFallsBackToOnDemand(t *testing.T) {
	fullSuite(t)
	t.Parallel()
	const pool = "mprice"
	machineModePool(t, pool, karpv1.CapacityTypeSpot, karpv1.CapacityTypeOnDemand)
	memberTemplate(t, pool, pool+"-r5-large-spot", "r5.large", capacityAnnotations("r5.large", map[string]string{
		v1alpha1.SpotPriceAnnotation: "0.03",
	}), func(s *infrav1.AWSMachineSpec) {
		s.SpotMarketOptions = &infrav1.SpotMarketOptions{MaxPrice: ptr.To("0.04")}
	})
	memberTemplate(t, pool, pool+"-r5-large", "r5.large", capacityAnnotations("r5.large", map[string]string{
		v1alpha1.PriceAnnotation: "0.126",
	}), nil)
	w.EC2.SetSpotPrice(ec2sim.Pool{InstanceType: "r5.large"}, 0.05)
	t.Cleanup(func() { w.EC2.SetSpotPrice(ec2sim.Pool{InstanceType: "r5.large"}, 0) })
	reports := recordCAPAReports(t, pool)

	d := app(t, pool, pool, 1, "1500m")
	v := waitView(t, 3*time.Minute, pool, pool, func(v view) bool {
		return v.RunningPods == 1 && len(v.Nodes) == 1 && len(v.Machines) == 1 && len(v.Instances) == 1
	})
	checkIdentity(t, v)
	if ct := v.Nodes[0].Labels[karpv1.CapacityTypeLabelKey]; ct != karpv1.CapacityTypeOnDemand {
		t.Fatalf("the node is %s; the spot template's max price is too low", ct)
	}
	if launchErrors("SpotMaxPriceTooLow", "r5.large") == 0 {
		t.Fatal("EC2 refused no spot request: the scenario did not exercise the fallback")
	}
	checkCAPAReportedLaunchFailure(t, reports(), "SpotMaxPriceTooLow")
	waitUnavailableOffering(t, pool, "r5.large", "", karpv1.CapacityTypeSpot)
	scaleToZeroAndCheckNothingLeaks(t, d, pool)
}

// Machine mode: EC2 interrupts a spot instance. Its Node goes; Karpenter
// replaces it; the interrupted instance's Machine is removed and nothing
// is left running but the nodes the pods need.
func TestMachineModeSpotInterruptionIsReplaced(t *testing.T) {
	fullSuite(t)
	t.Parallel()
	const pool = "mint"
	machineModePool(t, pool, karpv1.CapacityTypeSpot)
	memberTemplate(t, pool, pool+"-m6g-large", "m6g.large", capacityAnnotations("m6g.large", map[string]string{
		v1alpha1.SpotPriceAnnotation: "0.03",
	}), func(s *infrav1.AWSMachineSpec) { s.SpotMarketOptions = &infrav1.SpotMarketOptions{} })

	d := app(t, pool, pool, 2, "1500m")
	v := waitView(t, 3*time.Minute, pool, pool, func(v view) bool {
		// The victim's Machine is found by its providerID, which Cluster
		// API copies once CAPA reports the instance provisioned.
		return v.RunningPods == 2 && len(v.Nodes) == 2 && len(v.Machines) == 2 && len(v.Instances) == 2 && copied(v)
	})
	checkIdentity(t, v)
	victim := v.Nodes[0]
	_, id, _ := strings.Cut(strings.TrimPrefix(victim.Spec.ProviderID, "aws:///"), "/")
	var victimMachine string
	for _, m := range v.Machines {
		if m.Spec.ProviderID == victim.Spec.ProviderID {
			victimMachine = m.Name
		}
	}
	if err := w.EC2.Interrupt(id); err != nil {
		t.Fatal(err)
	}
	t.Logf("interrupted %s (node %s, Machine %s)", id, victim.Name, victimMachine)
	v = waitView(t, 4*time.Minute, pool, pool, func(v view) bool {
		if v.RunningPods != 2 || len(v.Nodes) != 2 || len(v.Machines) != 2 || len(v.Deleting) != 0 || len(v.Instances) != 2 {
			return false
		}
		for _, n := range v.Nodes {
			if n.Name == victim.Name {
				return false
			}
		}
		for _, m := range v.Machines {
			if m.Name == victimMachine {
				return false
			}
		}
		return true
	})
	checkIdentity(t, v)
	scaleToZeroAndCheckNothingLeaks(t, d, pool)
}

// Machine mode: CAPA's webhook refuses an in-place template change (its spec
// is immutable), so a user rolls a change out with a new template and takes
// the old one out of the pool. Every node is then drifted and replaced by
// an instance with the new settings.
func TestMachineModeTemplateChangeIsDriftAndRolled(t *testing.T) {
	fullSuite(t)
	t.Parallel()
	ctx := context.Background()
	const pool = "mdrift"
	machineModePool(t, pool)
	annotations := capacityAnnotations("c5.xlarge", map[string]string{v1alpha1.PriceAnnotation: "0.17"})
	old := memberTemplate(t, pool, pool+"-v1", "c5.xlarge", annotations, nil)

	d := app(t, pool, pool, 2, "3")
	v := waitView(t, 3*time.Minute, pool, pool, func(v view) bool {
		return v.RunningPods == 2 && len(v.Nodes) == 2 && len(v.Machines) == 2 && len(v.Instances) == 2
	})
	checkIdentity(t, v)
	oldInstances := map[string]bool{}
	for _, in := range v.Instances {
		oldInstances[in.ID] = true
	}

	// In place: refused by CAPA's validating webhook (it lets only an unset
	// instanceMetadataOptions be set in place).
	cur := &infrav1.AWSMachineTemplate{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(old), cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Template.Spec.IAMInstanceProfile = "nodes-v2.cluster-api-provider-aws.sigs.k8s.io"
	if err := w.Hub.Client.Update(ctx, cur); err == nil || !strings.Contains(err.Error(), "AWSMachineTemplate.Spec is immutable") {
		t.Fatalf("an in-place change of an AWSMachineTemplate's spec: want CAPA's webhook to refuse it as immutable, got %v", err)
	}

	// A new template with the change; the old one leaves the pool.
	memberTemplate(t, pool, pool+"-v2", "c5.xlarge", annotations, func(s *infrav1.AWSMachineSpec) {
		s.InstanceMetadataOptions = &infrav1.InstanceMetadataOptions{HTTPTokens: infrav1.HTTPTokensStateRequired,
			HTTPEndpoint: infrav1.InstanceMetadataEndpointStateEnabled, HTTPPutResponseHopLimit: 2, InstanceMetadataTags: infrav1.InstanceMetadataEndpointStateDisabled}
	})
	if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(old), cur); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	delete(cur.Labels, "pool")
	if err := w.Hub.Client.Patch(ctx, cur, patch); err != nil {
		t.Fatal(err)
	}
	v = waitView(t, 5*time.Minute, pool, pool, func(v view) bool {
		if v.RunningPods != 2 || len(v.Nodes) != 2 || len(v.Machines) != 2 || len(v.Instances) != 2 {
			return false
		}
		for _, in := range v.Instances {
			if oldInstances[in.ID] || in.HTTPTokens != "required" {
				return false
			}
		}
		return true
	})
	checkIdentity(t, v)
	for _, n := range v.Nodes {
		if _, ok := n.Labels[corev1.LabelInstanceTypeStable]; !ok {
			t.Errorf("node %s has no instance type label", n.Name)
		}
	}
	scaleToZeroAndCheckNothingLeaks(t, d, pool)
}

// Machine mode: a template no MachineDeployment uses has no owner Cluster,
// so CAPA never describes it; without capacity annotations the NodeClass
// says the capacity is unknown. Once the user makes the Cluster its owner,
// CAPA writes status.capacity and status.nodeInfo.architecture and the
// provider launches from them, without annotations.
func TestMachineModeTemplateCapacityFromCAPA(t *testing.T) {
	fullSuite(t)
	t.Parallel()
	ctx := context.Background()
	const pool = "mcap"
	machineModePool(t, pool)
	tmpl := memberTemplate(t, pool, pool+"-t3-medium", "t3.medium", map[string]string{v1alpha1.PriceAnnotation: "0.0416"}, nil)

	var message string
	err := e2e.WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		nc := &v1alpha1.ClusterAPINodeClass{}
		if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: pool}, nc); err != nil {
			return false, err
		}
		for _, c := range nc.Status.Conditions {
			if c.Type == "InstanceTypesResolved" {
				message = c.Message
				return c.Status == "False" && strings.Contains(c.Message, "unknown capacity"), nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("NodeClass %s: want InstanceTypesResolved=False naming the unknown capacity, got %q", pool, message)
	}
	cur := &infrav1.AWSMachineTemplate{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(tmpl), cur); err != nil {
		t.Fatal(err)
	}
	if len(cur.Status.Capacity) != 0 {
		t.Fatalf("CAPA described a template without an owner Cluster: %v", cur.Status.Capacity)
	}

	cluster := &clusterv1.Cluster{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: w.Namespace, Name: w.ClusterName}, cluster); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	cur.OwnerReferences = append(cur.OwnerReferences, metav1.OwnerReference{
		APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: cluster.Name, UID: cluster.UID,
	})
	if err := w.Hub.Client.Patch(ctx, cur, patch); err != nil {
		t.Fatal(err)
	}
	// No MachineDeployment gives CAPA a Kubernetes version to find the AMI
	// by: it writes capacity and architecture, no operating system (the
	// provider then assumes linux).
	waitCAPADescribed(t, tmpl, "2", "4Gi", "amd64", "")

	d := app(t, pool, pool, 1, "1500m")
	v := waitView(t, 3*time.Minute, pool, pool, func(v view) bool {
		return v.RunningPods == 1 && len(v.Nodes) == 1 && len(v.Machines) == 1 && len(v.Instances) == 1
	})
	checkIdentity(t, v)
	scaleToZeroAndCheckNothingLeaks(t, d, pool)
}

// Machine mode: a template that says marketType OnDemand explicitly (CAPA's
// own field) and has a spot price offers spot too. CAPA's webhook refuses
// an AWSMachine with both marketType OnDemand and spotMarketOptions, so a
// spot launch must ask for marketType Spot.
func TestMachineModeSpotFromAnExplicitlyOnDemandTemplate(t *testing.T) {
	t.Parallel()
	const pool = "mmarket"
	machineModePool(t, pool, karpv1.CapacityTypeSpot)
	memberTemplate(t, pool, pool+"-m5-large", "m5.large", capacityAnnotations("m5.large", map[string]string{
		v1alpha1.PriceAnnotation: "0.096", v1alpha1.SpotPriceAnnotation: "0.035",
	}), func(s *infrav1.AWSMachineSpec) { s.MarketType = infrav1.MarketTypeOnDemand })

	d := app(t, pool, pool, 1, "1500m")
	v := waitView(t, 3*time.Minute, pool, pool, func(v view) bool {
		return v.RunningPods == 1 && len(v.Nodes) == 1 && len(v.Machines) == 1 && len(v.Instances) == 1
	})
	checkIdentity(t, v)
	if in := v.Instances[0]; in.Market != ec2sim.Spot {
		t.Fatalf("instance %s is %s, want spot", in.ID, in.Market)
	}
	scaleToZeroAndCheckNothingLeaks(t, d, pool)
}
