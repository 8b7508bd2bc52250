package e2e

import (
	"testing"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// Two MachineDeployments of the same instance type, zone and price: a burst
// is shared between them, so that their two MachineSets make its Machines
// side by side (each makes the Machines of a raise one after another).
// Before, every NodeClaim went to the MachineDeployment found first and the
// other stayed at 0. With 20 NodeClaims spread by their names, each gets at
// least 2 but for a chance of 4 in 100 000.
func TestABurstIsSharedBetweenMachineDeploymentsOfTheSamePrice(t *testing.T) {
	pool(t, "spr")
	mds := []*clusterv1.MachineDeployment{
		machineDeployment(t, "spr", "spr-m5-large-a", "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.096"}),
		machineDeployment(t, "spr", "spr-m5-large-b", "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.096"}),
	}
	d := deployment(t, "spr", "app-spr", 20, "1500m") // one per m5.large

	start := time.Now()
	got := waitCounts(t, 6*time.Minute, "spr", "app-spr", mds, func(c counts) bool {
		return c.RunningPods == 20 && c.Nodes == 20 && c.BoundMachines == 20
	})
	t.Logf("20 pods running after %s: %s; replicas per MachineDeployment %v", time.Since(start).Round(time.Second), got, got.MachineDeploymentReplicas)
	if got.NodeClaims != 20 || got.Machines != 20 || got.Replicas != 20 || got.UnboundMachines != 0 {
		t.Fatalf("want exactly 20 NodeClaims, 20 Machines (all bound) and 20 replicas, got %s", got)
	}
	for _, md := range mds {
		if r := got.MachineDeploymentReplicas[md.Name]; r < 2 {
			t.Errorf("MachineDeployment %s has %d of the 20 replicas (%v): the burst went to one MachineDeployment", md.Name, r, got.MachineDeploymentReplicas)
		}
	}

	scaleDeployment(t, d, 0)
	got = waitCounts(t, 6*time.Minute, "spr", "app-spr", mds, func(c counts) bool {
		return c.NodeClaims == 0 && c.Nodes == 0 && c.Machines == 0 && c.Replicas == 0
	})
	if got.Pending != 0 {
		t.Fatalf("bookkeeping left on the MachineDeployments: %s", got)
	}
}
