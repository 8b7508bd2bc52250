package e2e

import (
	"context"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// Machine mode, one instance type (one no other scenario uses: the
// unavailable offerings are shared by both modes, as capacity is) exhausted in 3 of its 4 allowed
// offerings (spot in both zones, on-demand in one): the same Create tries
// them cheapest first and launches the fourth, as the AWS provider's
// CreateFleet does, without handing the NodeClaim back to Karpenter (one
// NodeClaim, never more). Each exhausted offering costs a round of Cluster
// API (Machine, then its AWSMachine) and of the infrastructure (the launch
// fails) before the next is tried. Issue 19's target (the fallback costs at
// most 10 s) is measured by BenchmarkFallback (make bench) on an idle
// machine; here, with the other packages' worlds on the same 2 cores, 30 s
// (the MachineDeployment-mode test's bound, well under a launch timeout) is
// the failure bound: CI measured 12 s at load 8.
func TestMachineModeFallsBackWithinOneCreate(t *testing.T) {
	zones := w.AWS.Zones()
	machinePool(t, "fb", machinePoolOptions{CapacityTypes: []string{karpv1.CapacityTypeSpot, karpv1.CapacityTypeOnDemand}})
	memberTemplate(t, "fb", "fb-c5-xlarge", "c5.xlarge", map[string]string{
		v1alpha1.PriceAnnotation: "0.096", v1alpha1.SpotPriceAnnotation: "0.035",
	})
	for _, o := range [][2]string{{zones[0], world.CapacityTypeSpot}, {zones[1], world.CapacityTypeSpot}, {zones[0], world.CapacityTypeOnDemand}} {
		w.AWS.SetInsufficientCapacity("c5.xlarge", o[0], o[1], true)
		t.Cleanup(func() { w.AWS.SetInsufficientCapacity("c5.xlarge", o[0], o[1], false) })
	}
	seen := watchNodeClaimNames(t, "fb")

	start := time.Now()
	workload(t, "fb", "fb-app", 1, "1500m", "", func(s *corev1.PodSpec) {
		s.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelTopologyZone, Operator: corev1.NodeSelectorOpIn, Values: zones[:2]}},
			}}},
		}}
	})
	nodes := waitAppNodes(t, 3*time.Minute, "fb-app", 1)
	running := time.Since(start)
	if got := nodes[0].Labels; got[corev1.LabelTopologyZone] != zones[1] || got[karpv1.CapacityTypeLabelKey] != karpv1.CapacityTypeOnDemand {
		t.Fatalf("the node is %s/%s, want the one offering left: %s/on-demand", got[corev1.LabelTopologyZone], got[karpv1.CapacityTypeLabelKey], zones[1])
	}
	if n := len(seen()); n != 1 {
		t.Fatalf("%d NodeClaims for one pod: the fallback went back to Karpenter instead of staying in one Create", n)
	}
	machines := poolMachinesWithIDs(t, time.Minute, "fb", nodes[0].Spec.ProviderID)
	// The Machine that launched is the newest; failed ones may still be
	// on their way out.
	sort.Slice(machines, func(i, j int) bool { return machines[i].CreationTimestamp.Before(&machines[j].CreationTimestamp) })
	last := machines[len(machines)-1]
	if last.Spec.ProviderID != nodes[0].Spec.ProviderID {
		t.Fatalf("the newest Machine %s has providerID %q, the node %q", last.Name, last.Spec.ProviderID, nodes[0].Spec.ProviderID)
	}
	// From the pod's creation (not the Deployment's: in a fresh world the
	// first ReplicaSet may take seconds to make it). Timestamps have a
	// resolution of a second.
	pods := &corev1.PodList{}
	if err := w.Spoke.Client.List(context.Background(), pods, client.MatchingLabels{"app": "fb-app"}); err != nil || len(pods.Items) == 0 {
		t.Fatalf("listing the pods of fb-app: %v (%d)", err, len(pods.Items))
	}
	podCreated := pods.Items[0].CreationTimestamp.Time
	for _, p := range pods.Items[1:] {
		if p.CreationTimestamp.Before(&metav1.Time{Time: podCreated}) {
			podCreated = p.CreationTimestamp.Time
		}
	}
	before := last.CreationTimestamp.Sub(podCreated)
	t.Logf("3 exhausted offerings tried; the launch that succeeded started %s after the pod (target 10 s, see BenchmarkFallback), pod running after %s", before.Round(time.Second), running.Round(time.Second))
	if before > 30*time.Second {
		t.Errorf("the launch that succeeded started %s after the pod was created, want within 30 s", before.Round(time.Second))
	}
	for _, o := range []string{"spot", "on-demand"} {
		waitHubEvent(t, "LaunchFailed", o)
	}
}
