package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// A launch returns once the instance has an ID, as the AWS provider's
// returns after CreateFleet, not once the instance booted and Cluster API
// copied its providerID onto the Machine: Karpenter plans no further pods
// while a launch it started has not returned, so a launch that waited for
// the boot held every later pod back by it (issue 19, the burst gap).
//
// With a 20 s boot, each NodeClaim must show its instance's providerID (the
// AWSMachine's) while its Machine has none yet; Karpenter must keep it
// meanwhile (the provider knows the Machine by that providerID: nothing is
// garbage-collected or relaunched), and the pods run on exactly one node
// each. Both modes.
func TestLaunchReturnsOnceTheInstanceHasAnID(t *testing.T) {
	const boot = 20 * time.Second
	w.AWS.SetProvisionDelay(boot)
	t.Cleanup(func() { w.AWS.SetProvisionDelay(world.DefaultProvisionDelay) })

	t.Run("MachineDeployment", func(t *testing.T) {
		pool(t, "early")
		md := machineDeployment(t, "early", "early-m5-large", "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
		mds := []*clusterv1.MachineDeployment{md}
		early := watchEarlyLaunches(t, "early")
		seen := watchNodeClaimNames(t, "early")
		d := deployment(t, "early", "app-early", 2, "1500m")
		got := waitCounts(t, 4*time.Minute, "early", "app-early", mds, func(c counts) bool {
			return c.RunningPods == 2 && c.Initialized == 2 && c.Nodes == 2 && c.BoundMachines == 2
		})
		if got.NodeClaims != 2 || got.Machines != 2 || got.Replicas != 2 {
			t.Fatalf("want exactly 2 NodeClaims, Machines and replicas, got %s", got)
		}
		checkEarly(t, early(), seen())
		scaleDeployment(t, d, 0)
		waitCounts(t, 4*time.Minute, "early", "app-early", mds, func(c counts) bool {
			return c.NodeClaims == 0 && c.Nodes == 0 && c.Machines == 0 && c.Replicas == 0
		})
	})

	t.Run("Machine", func(t *testing.T) {
		ctx := context.Background()
		machinePool(t, "earlym", machinePoolOptions{})
		memberTemplate(t, "earlym", "earlym-m5-large", "m5.large", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
		early := watchEarlyLaunches(t, "earlym")
		seen := watchNodeClaimNames(t, "earlym")
		workload(t, "earlym", "app-earlym", 2, "1500m", "", nil)
		waitAppNodes(t, 4*time.Minute, "app-earlym", 2)
		machines, err := poolMachines(ctx, "earlym")
		if err != nil {
			t.Fatal(err)
		}
		if len(machines) != 2 {
			t.Fatalf("want exactly 2 Machines for 2 pods, got %d", len(machines))
		}
		checkEarly(t, early(), seen())
	})
}

// checkEarly fails unless every NodeClaim ever seen was seen launched (the
// instance's providerID on it, the AWSMachine's) while its Machine had no
// providerID yet.
func checkEarly(t *testing.T, early map[string]string, seen map[string]bool) {
	t.Helper()
	if len(seen) != 2 {
		t.Fatalf("%d NodeClaims were created for 2 pods (%v): a launching NodeClaim was dropped or relaunched", len(seen), seen)
	}
	for name := range seen {
		why, ok := early[name]
		if !ok {
			t.Errorf("NodeClaim %s was never seen launched before its Machine had a providerID: the launch waited for the boot", name)
			continue
		}
		if why != "" {
			t.Errorf("NodeClaim %s: %s", name, why)
		}
	}
}

// watchEarlyLaunches polls the pool's NodeClaims every 200 ms; for each one
// that has a providerID while its Machine (the NodeClaim's annotation) has
// none, it records "" when that providerID is the Machine's AWSMachine's,
// or what is wrong.
func watchEarlyLaunches(t *testing.T, pool string) func() map[string]string {
	t.Helper()
	var mu sync.Mutex
	early := map[string]string{}
	stop := poll(200*time.Millisecond, func(ctx context.Context) {
		ncs := &karpv1.NodeClaimList{}
		if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
			return
		}
		for _, nc := range ncs.Items {
			ref := nc.Annotations[v1alpha1.MachineAnnotation]
			if nc.Status.ProviderID == "" || ref == "" {
				continue
			}
			mu.Lock()
			_, done := early[nc.Name]
			mu.Unlock()
			if done {
				continue
			}
			ns, name, _ := v1alpha1.MachineRef(nc.Annotations)
			m := &clusterv1.Machine{}
			if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, m); err != nil || m.Spec.ProviderID != "" {
				continue
			}
			am := &infrav1.AWSMachine{}
			why := ""
			if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.InfrastructureRef.Name}, am); err != nil {
				why = "reading its AWSMachine: " + err.Error()
			} else if id := am.Spec.ProviderID; id == nil || *id != nc.Status.ProviderID {
				why = "its providerID " + nc.Status.ProviderID + " is not its AWSMachine's"
			}
			mu.Lock()
			early[nc.Name] = why
			mu.Unlock()
		}
	})
	t.Cleanup(stop)
	return func() map[string]string {
		mu.Lock()
		defer mu.Unlock()
		out := make(map[string]string, len(early))
		for k, v := range early {
			out[k] = v
		}
		return out
	}
}
