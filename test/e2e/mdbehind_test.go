package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
)

// Core deletes a NodeClaim that has not launched within 5 minutes
// (LaunchTimeout): at 1 000 nodes it deleted 660 whose Machines waited in
// their MachineSet's queue (docs/performance.md). Two members of one
// offering; one MachineDeployment is paused (Cluster API's paused
// annotation: its replicas never reach its MachineSet, which makes no
// Machine), the other is healthy. The NodeClaims spread to the paused one
// move to the healthy one once their reservation has waited
// machinedeployment.DefaultMoveAfter: every NodeClaim launches, well within
// core's timeout, and none is deleted (core makes exactly one per pod).
// Before, they waited on the paused one until core deleted them, and their
// successors took their reservations there and waited again.
func TestALaunchMovesOffAMachineSetThatMakesNoMachine(t *testing.T) {
	const pods = 12 // one per m5.large; all on one member by chance: 1 in 2 048
	ctx := context.Background()
	pool(t, "mvb")
	price := map[string]string{v1alpha1.PriceAnnotation: "0.096"}
	held := machineDeployment(t, "mvb", "mvb-m5-large-a", "m5.large", "us-east-1a", price)
	healthy := machineDeployment(t, "mvb", "mvb-m5-large-b", "m5.large", "us-east-1a", price)
	mds := []*clusterv1.MachineDeployment{held, healthy}
	setPaused(t, client.ObjectKeyFromObject(held), true)
	unpaused := false
	defer func() {
		if !unpaused {
			setPaused(t, client.ObjectKeyFromObject(held), false)
		}
	}()

	start := time.Now()
	d := deployment(t, "mvb", "app-mvb", pods, "1500m")
	// Every NodeClaim core makes, and how long each took to launch.
	seen := map[string]time.Duration{}
	reservedOnHeld := map[string]bool{}
	var last counts
	bound := machinedeployment.DefaultMoveAfter + 3*time.Minute // core's 5 minutes, less a margin
	err := WaitFor(ctx, bound, func(ctx context.Context) (bool, error) {
		ncs := &karpv1.NodeClaimList{}
		if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: "mvb"}); err != nil {
			return false, err
		}
		launched := 0
		for _, nc := range ncs.Items {
			if _, ok := seen[nc.Name]; !ok {
				seen[nc.Name] = 0
			}
			if c := nc.StatusConditions().Get(karpv1.ConditionTypeLaunched); c != nil && c.IsTrue() {
				seen[nc.Name] = c.LastTransitionTime.Sub(nc.CreationTimestamp.Time)
				launched++
			}
		}
		_, pending, err := pendingOn(ctx, client.ObjectKeyFromObject(held))
		if err != nil {
			return false, err
		}
		for k := range pending {
			if !strings.HasPrefix(k, "moved:") {
				reservedOnHeld[k] = true
			}
		}
		if last, err = count(ctx, "mvb", "app-mvb", mds...); err != nil {
			return false, err
		}
		return launched == pods && last.RunningPods == pods, nil
	})
	t.Logf("after %s: %s; NodeClaims and their launch times %v; reserved on the paused %s first: %d",
		time.Since(start).Round(time.Second), last, seen, held.Name, len(reservedOnHeld))
	if err != nil {
		t.Fatalf("not every NodeClaim launched and every pod ran within %s (core deletes a NodeClaim not launched in 5 minutes): %v", bound, err)
	}
	if len(seen) != pods {
		t.Errorf("core made %d NodeClaims for %d pods: some were deleted before they launched", len(seen), pods)
	}
	if len(reservedOnHeld) == 0 {
		t.Fatalf("no NodeClaim reserved on the paused %s: nothing had to move (the burst hashed to one member)", held.Name)
	}
	if n := last.MachineDeploymentReplicas[healthy.Name]; n != pods {
		t.Errorf("%s has %d replicas, want %d: every NodeClaim runs there", healthy.Name, n, pods)
	}
	msgs, err := mdEventMessages(ctx, held, "LaunchMoved")
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) == 0 {
		t.Errorf("no LaunchMoved event on %s", held.Name)
	}

	// The paused one keeps the moved replicas as free reservations; once
	// it goes on, its MachineSet makes their Machines, which are given
	// back. Then both are back at zero, nothing left.
	scaleDeployment(t, d, 0)
	setPaused(t, client.ObjectKeyFromObject(held), false)
	unpaused = true
	got := waitCounts(t, 6*time.Minute, "mvb", "app-mvb", mds, func(c counts) bool {
		return c.NodeClaims == 0 && c.Nodes == 0 && c.Machines == 0 && c.Replicas == 0 && c.Pending == 0
	})
	for _, md := range mds {
		cur, pending, err := pendingOn(ctx, client.ObjectKeyFromObject(md))
		if err != nil {
			t.Fatal(err)
		}
		if cur.Annotations[machinedeployment.OwnedReplicasAnnotation] != "0" || len(pending) != 0 {
			t.Errorf("%s: owned %q, reservations %v after the scale-down (%s)", md.Name, cur.Annotations[machinedeployment.OwnedReplicasAnnotation], pending, got)
		}
	}
}
