package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// A worker MachineDeployment as clusterctl templates write it: no failure
// domain. The last round's provider never launched on it (84 failed
// launches in 4 minutes): offerings were looked up by a random zone. Pods
// must get exactly one node each, no launch may fail (every NodeClaim ever
// created is one of the final ones), and each NodeClaim learns its zone
// from its Node.
func TestMachineDeploymentWithoutFailureDomain(t *testing.T) {
	pool(t, "nz")
	md := machineDeployment(t, "nz", "nz-m5-large", "m5.large", "", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	mds := []*clusterv1.MachineDeployment{md}
	seen := watchNodeClaimNames(t, "nz")
	d := deployment(t, "nz", "app-nz", 4, "1500m")

	got := waitCounts(t, 4*time.Minute, "nz", "app-nz", mds, func(c counts) bool {
		return c.RunningPods == 4 && c.Initialized == 4 && c.Nodes == 4 && c.BoundMachines == 4 && c.Zones[w.AWS.Zones()[0]] == 4
	})
	if got.NodeClaims != 4 || got.Machines != 4 || got.Replicas != 4 || got.UnboundMachines != 0 {
		t.Fatalf("want exactly 4 NodeClaims, Machines (all bound) and replicas, got %s", got)
	}
	if n := len(seen()); n != 4 {
		t.Fatalf("%d NodeClaims were created for 4 pods: launches failed and were retried (%v)", n, seen())
	}
	// Core looks a running node's offering up by the node's zone (drift an
	// hour after launch, consolidation and cost prices): the zoneless
	// offering now has a price record in the zone its nodes registered in,
	// learnt from the Nodes (this NodeClass has no zoned offering at all).
	series := fmt.Sprintf(`karpenter_clusterapi_offering_price{capacity_type="on-demand",estimated="false",instance_type="m5.large",nodeclass="nz",zone=%q}`, w.AWS.Zones()[0])
	if err := WaitFor(context.Background(), time.Minute, func(context.Context) (bool, error) {
		v, ok, err := provider.Metric(series)
		return ok && v == 0.096, err
	}); err != nil {
		t.Fatalf("no price record %s 0.096: %v", series, err)
	}

	scaleDeployment(t, d, 0)
	waitCounts(t, 4*time.Minute, "nz", "app-nz", mds, func(c counts) bool {
		return c.NodeClaims == 0 && c.Nodes == 0 && c.Machines == 0 && c.Replicas == 0
	})
}

// watchNodeClaimNames records every NodeClaim of the pool that exists at
// any poll (every 200 ms) until the test ends, and returns a reader.
func watchNodeClaimNames(t *testing.T, pool string) func() map[string]bool {
	t.Helper()
	var mu sync.Mutex
	names := map[string]bool{}
	stop := poll(200*time.Millisecond, func(ctx context.Context) {
		ncs := &karpv1.NodeClaimList{}
		if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err == nil {
			mu.Lock()
			for _, nc := range ncs.Items {
				names[nc.Name] = true
			}
			mu.Unlock()
		}
	})
	t.Cleanup(stop)
	return func() map[string]bool {
		mu.Lock()
		defer mu.Unlock()
		out := make(map[string]bool, len(names))
		for k := range names {
			out[k] = true
		}
		return out
	}
}

// Pods that spread over zones, beside a cheaper MachineDeployment without a
// failure domain: Karpenter pins each of their NodeClaims to a zone, and the
// zoneless MachineDeployment (whose instances land wherever the
// infrastructure puts them: here always the first zone) must not serve them,
// or the spread collapses into one zone (Karpenter's
// DefaultTopologySpreadConstraints conformance specs saw exactly that). A pod
// that asks for no zone still gets the cheaper zoneless one.
func TestZoneSpreadIsNotServedByAZonelessMachineDeployment(t *testing.T) {
	pool(t, "zs")
	anywhere := machineDeployment(t, "zs", "zs-m6i-large", "m6i.large", "", map[string]string{v1alpha1.PriceAnnotation: "0.09"})
	zones := w.AWS.Zones()
	mds := []*clusterv1.MachineDeployment{anywhere}
	for _, z := range zones[:3] {
		mds = append(mds, machineDeployment(t, "zs", "zs-r5-large-"+z, "r5.large", z, map[string]string{v1alpha1.PriceAnnotation: "0.126"}))
	}
	podDeployment(t, "zs", "zs-spread", 3, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m")}, func(s *corev1.PodSpec) {
		s.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone, WhenUnsatisfiable: corev1.DoNotSchedule,
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "zs-spread"}},
		}}
	})
	spread := waitAppNodes(t, 4*time.Minute, "zs-spread", 3)
	inZone := map[string]bool{}
	for _, n := range spread {
		if got := n.Labels[corev1.LabelInstanceTypeStable]; got != "r5.large" {
			t.Errorf("spread pod on %s (%s), want r5.large: a zoneless offering served a NodeClaim pinned to a zone", n.Name, got)
		}
		inZone[n.Labels[corev1.LabelTopologyZone]] = true
	}
	if len(inZone) != 3 {
		t.Errorf("the spread pods run in zones %v, want 3 distinct zones", inZone)
	}

	deployment(t, "zs", "zs-any", 1, "1500m")
	anyNodes := waitAppNodes(t, 4*time.Minute, "zs-any", 1)
	if got := anyNodes[0].Labels[corev1.LabelInstanceTypeStable]; got != "m6i.large" {
		t.Errorf("a pod that asks for no zone runs on %s, want the cheaper zoneless m6i.large", got)
	}
	got := waitCounts(t, 2*time.Minute, "zs", "zs-spread", mds, func(c counts) bool {
		return c.NodeClaims == 4 && c.Machines == 4 && c.BoundMachines == 4
	})
	t.Logf("spread over %v, the unconstrained pod on %s: %s", inZone, anyNodes[0].Labels[corev1.LabelInstanceTypeStable], got)
}
