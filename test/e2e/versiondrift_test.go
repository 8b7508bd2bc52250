package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// replacementWithin is how soon after a version change Karpenter must have
// made the first replacement NodeClaim (issue 45): its drift check is
// woken by the NodeClass's status, not left to its 5-minute requeue.
const replacementWithin = 30 * time.Second

// upgradedVersion is the version the scenarios move to.
const upgradedVersion = "v1.36.4"

// A control-plane upgrade in Machine mode (an EKS-like managed control
// plane: spec.version moves, then status.version once it runs the new
// version): the first replacement NodeClaim of a pool is made within
// replacementWithin of status.version moving, and its Machine runs the new
// version. The world's Cluster is shared: its control plane goes back to
// the old version after the pool is gone.
func TestControlPlaneUpgradeStartsReplacingMachineModeNodesAtOnce(t *testing.T) {
	ctx := context.Background()
	const name = "cpup"
	cp := worldControlPlane(t)
	t.Cleanup(func() { setControlPlaneVersion(t, cp, world.KubeletVersion) }) // runs last: after the pool is gone
	machinePool(t, name, machinePoolOptions{Budget: "1"})
	memberTemplate(t, name, name+"-m5", "m5.large", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	workload(t, name, name+"-app", 2, "1500m", "", nil)
	waitAppNodes(t, 4*time.Minute, name+"-app", 2)
	before := settledNodeClaims(t, name, 2)

	setControlPlaneVersion(t, cp, upgradedVersion)
	start := time.Now()
	first := waitReplacement(t, name, before, start)
	t.Logf("first replacement NodeClaim %s %s after the control plane's status.version moved", first, time.Since(start).Round(100*time.Millisecond))
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		ms, err := poolMachines(ctx, name)
		for _, m := range ms {
			if m.Annotations[v1alpha1.NodeClaimAnnotation] == first {
				return m.Spec.Version == upgradedVersion, err
			}
		}
		return false, err
	}); err != nil {
		t.Fatalf("the Machine of NodeClaim %s does not run %s: %v", first, upgradedVersion, err)
	}
}

// A version change of a member MachineDeployment (OnDelete: Karpenter
// replaces the nodes): the first replacement NodeClaim within
// replacementWithin of the change.
func TestMachineDeploymentVersionChangeStartsReplacingNodesAtOnce(t *testing.T) {
	ctx := context.Background()
	const name = "mdver"
	app := name + "-app"
	pool(t, name)
	setBudget(t, name, "1")
	if _, err := w.CreateAWSMachineTemplate(ctx, name+"-m5", "m5.large", false); err != nil {
		t.Fatal(err)
	}
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: w.Namespace, Name: name, ClusterName: w.ClusterName, Member: true, InfraTemplate: name + "-m5",
		Labels: map[string]string{"pool": name}, Annotations: map[string]string{v1alpha1.PriceAnnotation: "0.096"}, FailureDomain: "us-east-1c",
	})
	md.Spec.Rollout.Strategy.Type = clusterv1.OnDeleteMachineDeploymentStrategyType
	md.Spec.Template.Spec.Version = world.KubeletVersion
	if err := w.Hub.Client.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	deployment(t, name, app, 2, "1500m")
	waitCounts(t, 4*time.Minute, name, app, []*clusterv1.MachineDeployment{md}, func(c counts) bool {
		return c.RunningPods == 2 && c.Initialized == 2 && c.BoundMachines == 2
	})
	before := settledNodeClaims(t, name, 2)

	cur := &clusterv1.MachineDeployment{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	cur.Spec.Template.Spec.Version = upgradedVersion
	if err := w.Hub.Client.Patch(ctx, cur, patch); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	first := waitReplacement(t, name, before, start)
	t.Logf("first replacement NodeClaim %s %s after the MachineDeployment's version changed", first, time.Since(start).Round(100*time.Millisecond))
}

// setBudget sets a NodePool's disruption budget.
func setBudget(t *testing.T, pool, nodes string) {
	t.Helper()
	np := &karpv1.NodePool{}
	if err := w.Spoke.Client.Get(context.Background(), client.ObjectKey{Name: pool}, np); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(np.DeepCopy())
	np.Spec.Disruption.Budgets = []karpv1.Budget{{Nodes: nodes}}
	if err := w.Spoke.Client.Patch(context.Background(), np, patch); err != nil {
		t.Fatal(err)
	}
}

// settledNodeClaims waits until the NodePool's n NodeClaims are settled as
// a user's running nodes are, and returns their names. Karpenter checks a
// NodeClaim's drift whenever it reconciles it, which it does at every event
// of the NodeClaim or its pods and until its consolidateAfter has passed
// since the last pod event (Consolidatable); after that only an event, or
// its 5-minute requeue, makes it look again. A version change right after
// the launch would be seen by chance; on settled nodes only a NodeClass
// change (status.driftHash) makes Karpenter look before the 5 minutes.
func settledNodeClaims(t *testing.T, pool string, n int) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	err := WaitFor(context.Background(), 2*time.Minute, func(ctx context.Context) (bool, error) {
		list := &karpv1.NodeClaimList{}
		if err := w.Spoke.Client.List(ctx, list, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
			return false, err
		}
		clear(out)
		for _, nc := range list.Items {
			if !nc.StatusConditions().Get(karpv1.ConditionTypeConsolidatable).IsTrue() {
				return false, nil
			}
			out[nc.Name] = true
		}
		return len(out) == n, nil
	})
	if err != nil {
		t.Fatalf("NodePool %s: %d NodeClaims not all consolidatable: %v", pool, n, err)
	}
	// The Consolidatable update is itself an event Karpenter reconciles
	// (and checks drift at): let those reconciles pass.
	time.Sleep(3 * time.Second)
	return out
}

// waitReplacement waits until replacementWithin after start for a NodeClaim
// of the pool that is not one of before, and returns its name.
func waitReplacement(t *testing.T, pool string, before map[string]bool, start time.Time) string {
	t.Helper()
	var first, drifted string
	err := WaitFor(context.Background(), replacementWithin-time.Since(start), func(ctx context.Context) (bool, error) {
		list := &karpv1.NodeClaimList{}
		if err := w.Spoke.Client.List(ctx, list, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
			return false, err
		}
		for _, nc := range list.Items {
			if c := nc.StatusConditions().Get(karpv1.ConditionTypeDrifted); c != nil && c.IsTrue() && drifted == "" {
				drifted = fmt.Sprintf("%s drifted (%s) after %s", nc.Name, c.Reason, time.Since(start).Round(100*time.Millisecond))
			}
			if !before[nc.Name] {
				first = nc.Name
				return true, nil
			}
		}
		return false, nil
	})
	if drifted != "" {
		t.Log(drifted)
	}
	if err != nil {
		logSpokeEvents(t, pool)
		t.Fatalf("no replacement NodeClaim of NodePool %s within %s of the version change (drift seen: %q): %v", pool, replacementWithin, drifted, err)
	}
	return first
}

// worldControlPlane returns the world's Cluster's control plane object.
func worldControlPlane(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	cluster := &clusterv1.Cluster{}
	if err := w.Hub.Client.Get(context.Background(), client.ObjectKey{Namespace: w.Namespace, Name: w.ClusterName}, cluster); err != nil {
		t.Fatal(err)
	}
	ref := cluster.Spec.ControlPlaneRef
	cp := &unstructured.Unstructured{}
	cp.SetAPIVersion(ref.APIGroup + "/" + world.ControlPlaneVersion)
	cp.SetKind(ref.Kind)
	cp.SetNamespace(w.Namespace)
	cp.SetName(ref.Name)
	return cp
}

// setControlPlaneVersion upgrades (or downgrades) the world's managed
// control plane as its provider would: spec.version, then status.version
// once it runs it.
func setControlPlaneVersion(t *testing.T, cp *unstructured.Unstructured, version string) {
	t.Helper()
	ctx := context.Background()
	for _, field := range []string{"spec", "status"} {
		err := WaitFor(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
			cur := cp.DeepCopy()
			if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(cp), cur); err != nil {
				return false, err
			}
			if err := unstructured.SetNestedField(cur.Object, version, field, "version"); err != nil {
				return false, err
			}
			var err error
			if field == "status" {
				err = w.Hub.Client.Status().Update(ctx, cur)
			} else {
				err = w.Hub.Client.Update(ctx, cur)
			}
			return err == nil, nil
		})
		if err != nil {
			t.Fatalf("setting %s.version of %s %s to %s: %v", field, cp.GetKind(), cp.GetName(), version, err)
		}
	}
}
