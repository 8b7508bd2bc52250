package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1alpha1 "sigs.k8s.io/karpenter/pkg/apis/v1alpha1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// Of two MachineDeployments that both fit a pod, priced 0.20 and 0.10, the
// 0.10 one is used, even though it is the bigger machine.
func TestPriceDecidesBetweenFittingMachineDeployments(t *testing.T) {
	pool(t, "price")
	dear := machineDeployment(t, "price", "price-m5-large", "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.20"})
	cheap := machineDeployment(t, "price", "price-m5-xlarge", "m5.xlarge", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.10"})
	deployment(t, "price", "app-price", 1, "1")
	got := waitCounts(t, 4*time.Minute, "price", "app-price", []*clusterv1.MachineDeployment{dear, cheap}, func(c counts) bool { return c.RunningPods == 1 })
	if got.MachineDeploymentReplicas["price-m5-xlarge"] != 1 || got.MachineDeploymentReplicas["price-m5-large"] != 0 {
		t.Fatalf("want the 0.10 MachineDeployment, got replicas %v", got.MachineDeploymentReplicas)
	}
}

// A workload on a node of a 0.40/h MachineDeployment shrinks until a 0.10/h
// node fits it: Karpenter replaces the node with the cheaper one.
func TestConsolidationReplacesWithCheaperMachineDeployment(t *testing.T) {
	pool(t, "cons")
	big := machineDeployment(t, "cons", "cons-m5-2xlarge", "m5.2xlarge", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.40"})
	small := machineDeployment(t, "cons", "cons-m5-large", "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.10"})
	mds := []*clusterv1.MachineDeployment{big, small}
	// Five 1-CPU pods: one m5.2xlarge (0.40) is cheaper than five m5.large (0.50).
	d := deployment(t, "cons", "app-cons", 5, "1")
	got := waitCounts(t, 4*time.Minute, "cons", "app-cons", mds, func(c counts) bool { return c.RunningPods == 5 })
	if got.MachineDeploymentReplicas["cons-m5-2xlarge"] != 1 || got.NodeClaims != 1 {
		t.Fatalf("want one m5.2xlarge for five pods, got %s replicas %v", got, got.MachineDeploymentReplicas)
	}

	scaleDeployment(t, d, 1)
	got = waitCounts(t, 5*time.Minute, "cons", "app-cons", mds, func(c counts) bool {
		return c.RunningPods == 1 && c.NodeClaims == 1 && c.InstanceTypes["m5.large"] == 1 &&
			c.MachineDeploymentReplicas["cons-m5-2xlarge"] == 0 && c.Machines == 1
	})
	if got.MachineDeploymentReplicas["cons-m5-large"] != 1 {
		t.Fatalf("want the pod moved to one m5.large, got %s replicas %v", got, got.MachineDeploymentReplicas)
	}
}

// A NodeOverlay that raises the cheaper type's price flips the choice, also
// when it was written before the MachineDeployments it prices existed (core
// evaluated it then against a NodePool with no instance types): a user
// adding a MachineDeployment to a cluster whose overlays are in place.
func TestNodeOverlayPriceFlipsTheChoice(t *testing.T) {
	ctx := context.Background()
	pool(t, "ovl")
	price := "0.50"
	overlay := &karpv1alpha1.NodeOverlay{
		ObjectMeta: metav1.ObjectMeta{Name: "ovl-m5-large-dearer"},
		Spec: karpv1alpha1.NodeOverlaySpec{
			Requirements: []karpv1alpha1.NodeSelectorRequirement{
				{Key: "karpenter.sh/nodepool", Operator: corev1.NodeSelectorOpIn, Values: []string{"ovl"}},
				{Key: corev1.LabelInstanceTypeStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"m5.large"}},
			},
			Price: &price,
		},
	}
	if err := w.Spoke.Client.Create(ctx, overlay); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Spoke.Client.Delete(context.Background(), overlay) })
	// Wait until core has evaluated the overlay (it reports it on the
	// overlay's status): at that moment the pool has no instance types.
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		o := &karpv1alpha1.NodeOverlay{}
		if err := w.Spoke.Client.Get(ctx, client.ObjectKeyFromObject(overlay), o); err != nil {
			return false, err
		}
		return o.StatusConditions().Root().IsTrue(), nil
	}); err != nil {
		t.Fatalf("NodeOverlay not ready: %v", err)
	}
	small := machineDeployment(t, "ovl", "ovl-m5-large", "m5.large", "us-east-1b", map[string]string{v1alpha1.PriceAnnotation: "0.10"})
	big := machineDeployment(t, "ovl", "ovl-m5-xlarge", "m5.xlarge", "us-east-1b", map[string]string{v1alpha1.PriceAnnotation: "0.20"})
	mds := []*clusterv1.MachineDeployment{small, big}
	// Both types are in the NodeClass's catalogue before the pod exists.
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		nc := &v1alpha1.ClusterAPINodeClass{}
		if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: "ovl"}, nc); err != nil {
			return false, err
		}
		return slices.Equal(nc.Status.InstanceTypes, []string{"m5.large", "m5.xlarge"}), nil
	}); err != nil {
		t.Fatalf("NodeClass ovl does not list both instance types: %v", err)
	}
	deployment(t, "ovl", "app-ovl", 1, "1")
	got := waitCounts(t, 4*time.Minute, "ovl", "app-ovl", mds, func(c counts) bool { return c.RunningPods == 1 })
	if got.MachineDeploymentReplicas["ovl-m5-xlarge"] != 1 || got.MachineDeploymentReplicas["ovl-m5-large"] != 0 {
		t.Fatalf("with m5.large overlaid to 0.50, want m5.xlarge (0.20), got replicas %v", got.MachineDeploymentReplicas)
	}
}

// With no price annotations the estimate decides (the smaller node wins) and
// the NodeClass says prices are estimated.
func TestEstimatedPricesWhenNoneAreGiven(t *testing.T) {
	pool(t, "est")
	small := machineDeployment(t, "est", "est-m5-large", "m5.large", "us-east-1c", nil)
	big := machineDeployment(t, "est", "est-m5-xlarge", "m5.xlarge", "us-east-1c", nil)
	deployment(t, "est", "app-est", 1, "1")
	got := waitCounts(t, 4*time.Minute, "est", "app-est", []*clusterv1.MachineDeployment{small, big}, func(c counts) bool { return c.RunningPods == 1 })
	if got.MachineDeploymentReplicas["est-m5-large"] != 1 || got.MachineDeploymentReplicas["est-m5-xlarge"] != 0 {
		t.Fatalf("by estimate the smaller m5.large is cheaper, got replicas %v", got.MachineDeploymentReplicas)
	}
	nc := &v1alpha1.ClusterAPINodeClass{}
	if err := w.Spoke.Client.Get(context.Background(), client.ObjectKey{Name: "est"}, nc); err != nil {
		t.Fatal(err)
	}
	cond := nc.StatusConditions().Get(v1alpha1.ConditionTypePricesConfigured)
	if cond == nil || !cond.IsFalse() || cond.Reason != "Estimated" {
		t.Fatalf("want PricesConfigured=False/Estimated, got %+v", cond)
	}
	if !slices.Equal(nc.Status.EstimatedPrices, []string{"m5.large", "m5.xlarge"}) {
		t.Fatalf("status.estimatedPrices = %v", nc.Status.EstimatedPrices)
	}
}
