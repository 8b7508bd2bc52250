package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// Issue 35, "a user's young Machines are never taken": a user scales a
// member MachineDeployment to 2 with no pods for them; its Machines join
// with Karpenter's unregistered taint (as the docs require of member
// MachineDeployments); 3 s later pods go pending. Karpenter's NodeClaims get
// Machines of their own, made for their raise: the user's two are never
// bound (on e402286 both were bound 60-100 ms after the NodeClaims
// appeared: a Machine made up to 10 s before a raise counted as made for
// it). The provider then reports the user's two as Machines no NodeClaim
// owns (event UnownedMachines on the MachineDeployment and the metric), and
// every replica change it made is one log line and one ReplicasChanged
// event naming the NodeClaims. Karpenter's scale-down leaves the user's
// replicas and Machines alone.
func TestAUsersYoungMachinesAreNeverTaken(t *testing.T) {
	ctx := context.Background()
	const name = "young"
	pool(t, name)
	md := machineDeployment(t, name, "young-m5-large", "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	mds := []*clusterv1.MachineDeployment{md}
	if err := waitNodePoolReady(ctx, name); err != nil {
		t.Fatalf("NodePool %s not ready: %v", name, err)
	}
	logFrom := logSize(t, provider.LogPath)
	watch := watchMachineDeployment(t, md, name)

	// The user's two Machines, joined with the unregistered taint.
	scaleMachineDeployment(t, md, 2)
	var users []string
	if err := WaitFor(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		machines, err := machinesOfMD(ctx, md)
		if err != nil {
			return false, err
		}
		users = nil
		for _, m := range machines {
			if !m.Status.NodeRef.IsDefined() {
				return false, nil
			}
			node := &corev1.Node{}
			if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: m.Status.NodeRef.Name}, node); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			tainted := false
			for _, taint := range node.Spec.Taints {
				tainted = tainted || taint.MatchTaint(&world.UnregisteredTaint)
			}
			if !tainted {
				return false, fmt.Errorf("Node %s of the user's Machine %s has no unregistered taint", node.Name, m.Name)
			}
			users = append(users, m.Name)
		}
		return len(users) == 2, nil
	}); err != nil {
		t.Fatalf("the user's 2 Machines of %s did not join: %v", md.Name, err)
	}
	t.Logf("the user's Machines %v joined with the unregistered taint", users)

	// The scenario's timing: pods come a few seconds after the user's
	// Machines joined (the held-out run used 3 s).
	time.Sleep(3 * time.Second)
	start := time.Now()
	d := deployment(t, name, "app-young", 2, "1500m") // one per m5.large
	got := waitCounts(t, 4*time.Minute, name, "app-young", mds, func(c counts) bool {
		return c.RunningPods == 2 && c.NodeClaims == 2 && c.BoundMachines == 2
	})
	t.Logf("2 pods running %s after they were created: %s", time.Since(start).Round(100*time.Millisecond), got)
	if got.Machines != 4 || got.Replicas != 4 || got.UnboundMachines != 2 {
		t.Errorf("want 4 Machines (2 bound to NodeClaims, the user's 2 unbound) and replicas 4, got %s", got)
	}
	var claims []string
	for _, c := range nodeClaimNames(t, name) {
		claims = append(claims, c)
		for _, m := range watch.boundTo(c) {
			for _, u := range users {
				if m == u {
					t.Errorf("the user's Machine %s was bound to NodeClaim %s", u, c)
				}
			}
		}
	}
	for _, u := range users {
		if c, ok := watch.everBound(u); ok {
			t.Errorf("the user's Machine %s was bound to NodeClaim %s", u, c)
		}
	}
	if v := ownedReplicas(t, md); v != "2" {
		t.Errorf("owned replicas %q, want 2 (the user's 2 stay the user's)", v)
	}

	// The user's two are reported: an event and the metric.
	series := fmt.Sprintf(`karpenter_clusterapi_machinedeployment_unowned_machines{machinedeployment=%q,namespace=%q}`, md.Name, md.Namespace)
	var value float64
	if err := WaitFor(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		v, ok, err := provider.Metric(series)
		value = v
		return err == nil && ok && v == 2 && mdEvents(t, md, "UnownedMachines") > 0, err
	}); err != nil {
		t.Errorf("the user's 2 Machines not reported: metric %s = %v, %d UnownedMachines events: %v", series, value, mdEvents(t, md, "UnownedMachines"), err)
	}
	if msgs, err := mdEventMessages(ctx, md, "UnownedMachines"); err == nil {
		t.Logf("UnownedMachines events: %v", msgs)
	}

	// Karpenter's scale-down gives back its own replicas only.
	scaleDeployment(t, d, 0)
	got = waitCounts(t, 4*time.Minute, name, "app-young", mds, func(c counts) bool {
		return c.NodeClaims == 0 && c.Machines == 2 && c.Replicas == 2
	})
	machines, err := machinesOfMD(ctx, md)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range machines {
		if m.Name != users[0] && m.Name != users[1] || !m.DeletionTimestamp.IsZero() {
			t.Errorf("after Karpenter's scale-down Machine %s remains (deleting %v), want only the user's %v", m.Name, !m.DeletionTimestamp.IsZero(), users)
		}
	}
	if v := ownedReplicas(t, md); v != "0" {
		t.Errorf("owned replicas %q after the scale-down, want 0", v)
	}
	// Every replica change, up and down: one log line and one event,
	// naming the NodeClaims.
	checkReplicaChanges(t, md, provider.LogPath, logFrom, claims...)
	// The user's own scale-down ends the scenario.
	scaleMachineDeployment(t, md, 0)
	waitCounts(t, 3*time.Minute, name, "app-young", mds, func(c counts) bool { return c.Machines == 0 })
}

// machinesOfMD lists a MachineDeployment's Machines in the hub.
func machinesOfMD(ctx context.Context, md *clusterv1.MachineDeployment) ([]clusterv1.Machine, error) {
	list := &clusterv1.MachineList{}
	err := w.Hub.Client.List(ctx, list, client.InNamespace(md.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name})
	return list.Items, err
}
