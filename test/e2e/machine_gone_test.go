package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/controllers/machinegone"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// A launch returns once the instance has an ID; a Machine deleted while its
// instance boots leaves its NodeClaim nothing to register. Karpenter core
// would replace it only after its 15-minute registration timeout (its
// garbage collection takes registered NodeClaims alone), its pods pending
// all along: the provider deletes such a NodeClaim at once and core
// launches a replacement (CI of stop 24: a concurrent writer's scale-down
// picked a booting Karpenter Machine; the pod waited past 6 minutes).
//
// MachineDeployment mode: someone scales the MachineDeployment down by one
// and picks Karpenter's booting Machine for it (Cluster API's delete-machine
// annotation), as kubectl users and autoscalers do. Machine mode: someone
// deletes the booting Machine (a MachineHealthCheck, a user). A 40 s boot
// leaves the window; the NodeClaim must be gone within 30 s of the
// deletion, long before any timeout, and the pod run on its replacement.
func TestNodeClaimWhoseMachineGoesWhileBootingIsReplaced(t *testing.T) {
	const boot = 40 * time.Second
	w.AWS.SetProvisionDelay(boot)
	t.Cleanup(func() { w.AWS.SetProvisionDelay(world.DefaultProvisionDelay) })

	t.Run("MachineDeployment", func(t *testing.T) {
		ctx := context.Background()
		pool(t, "gone")
		md := machineDeployment(t, "gone", "gone-m5-large", "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
		mds := []*clusterv1.MachineDeployment{md}
		deployment(t, "gone", "app-gone", 1, "1500m")
		nc, m := bootingNodeClaim(t, "gone")
		mark := client.MergeFrom(m.DeepCopy())
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[clusterv1.DeleteMachineAnnotation] = "someone"
		if err := w.Hub.Client.Patch(ctx, m, mark); err != nil {
			t.Fatal(err)
		}
		if _, err := scaleBy(ctx, md, -1); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		replacedWithin(t, nc, m, 30*time.Second)
		got := waitCounts(t, 4*time.Minute, "gone", "app-gone", mds, func(c counts) bool {
			return c.RunningPods == 1 && c.NodeClaims == 1 && c.Initialized == 1 && c.Pending == 0 &&
				c.Machines == 1 && c.BoundMachines == 1 && c.Replicas == 1
		})
		t.Logf("NodeClaim %s replaced; settled %s after the scale-down: %s", nc.Name, time.Since(start).Round(time.Second), got)
		if v := ownedReplicas(t, md); v != "1" {
			t.Fatalf("owned replicas %q, want 1 (the replacement's)", v)
		}
	})

	t.Run("Machine", func(t *testing.T) {
		ctx := context.Background()
		machinePool(t, "gonem", machinePoolOptions{})
		memberTemplate(t, "gonem", "gonem-m5-large", "m5.large", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
		workload(t, "gonem", "app-gonem", 1, "1500m", "", nil)
		nc, m := bootingNodeClaim(t, "gonem")
		if err := w.Hub.Client.Delete(ctx, m); err != nil {
			t.Fatal(err)
		}
		replacedWithin(t, nc, m, 30*time.Second)
		waitAppNodes(t, 4*time.Minute, "app-gonem", 1)
		machines, err := poolMachines(ctx, "gonem")
		if err != nil {
			t.Fatal(err)
		}
		if len(machines) != 1 || machines[0].Name == m.Name {
			t.Fatalf("want one new Machine for the replacement, got %d", len(machines))
		}
	})
}

// bootingNodeClaim waits for the pool's one NodeClaim to be launched (its
// instance has an ID) while its Node has not registered, and returns it
// with its Machine.
func bootingNodeClaim(t *testing.T, pool string) (*karpv1.NodeClaim, *clusterv1.Machine) {
	t.Helper()
	var nc *karpv1.NodeClaim
	var m *clusterv1.Machine
	if err := WaitFor(context.Background(), 2*time.Minute, func(ctx context.Context) (bool, error) {
		ncs := &karpv1.NodeClaimList{}
		if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
			return false, err
		}
		for i := range ncs.Items {
			c := &ncs.Items[i]
			ns, name, ok := v1alpha1.MachineRef(c.Annotations)
			if c.Status.ProviderID == "" || !ok {
				continue
			}
			if c.StatusConditions().IsTrue(karpv1.ConditionTypeRegistered) {
				t.Fatalf("NodeClaim %s registered before the test saw it booting: the boot is too short for the test", c.Name)
			}
			got := &clusterv1.Machine{}
			if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, got); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			nc, m = c, got
			return true, nil
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no NodeClaim of pool %s launched: %v", pool, err)
	}
	return nc, m
}

// replacedWithin fails unless the NodeClaim is gone within d of its
// Machine's deletion, with a MachineGone event naming the Machine.
func replacedWithin(t *testing.T, nc *karpv1.NodeClaim, m *clusterv1.Machine, d time.Duration) {
	t.Helper()
	if err := WaitFor(context.Background(), d, func(ctx context.Context) (bool, error) {
		err := w.Spoke.Client.Get(ctx, client.ObjectKeyFromObject(nc), &karpv1.NodeClaim{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}); err != nil {
		t.Fatalf("NodeClaim %s still there %s after its Machine %s was deleted while booting (core's registration timeout is 15 minutes): %v", nc.Name, d, m.Name, err)
	}
	if err := WaitFor(context.Background(), 10*time.Second, func(ctx context.Context) (bool, error) {
		events := &corev1.EventList{}
		if err := w.Spoke.Client.List(ctx, events); err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.InvolvedObject.Name == nc.Name && e.Reason == machinegone.ReasonMachineGone && strings.Contains(e.Message, m.Name) {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no %s event on NodeClaim %s naming Machine %s: %v", machinegone.ReasonMachineGone, nc.Name, m.Name, err)
	}
}
