package world_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/placement"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// TestSplitWorld: a split world runs the management side (hub API server
// and etcd, Cluster API with the simulated AWS) and the workload side
// (spoke API server and etcd, scheduler, controller manager, simulated
// kubelet) in processes of their own, each on its CPU, and works through
// them: a MachineDeployment's Machine gets an instance whose Node the
// kubelet side registers Ready, with the provisioning delay set across
// processes, and the Node goes once the MachineDeployment is scaled to 0.
func TestSplitWorld(t *testing.T) {
	online, err := placement.Online()
	if err != nil {
		t.Fatal(err)
	}
	if len(online) < 2 {
		t.Skipf("a split placement needs 2 CPUs; this process may use %s", online)
	}
	hubCPU, workloadCPU := placement.CPUs{online[0]}, placement.CPUs{online[1]}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	w, err := world.Start(ctx, world.Options{Split: &world.SplitOptions{HubCPUs: hubCPU, WorkloadCPUs: workloadCPU}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("split world started in %s", time.Since(start).Round(100*time.Millisecond))
	defer func() {
		if t.Failed() {
			w.KeepDir = true
			t.Logf("world logs: %s", strings.Join(w.LogFiles(), " "))
		}
		if err := w.Stop(); err != nil {
			t.Errorf("stopping the world: %v", err)
		}
	}()

	procs, err := w.Processes()
	if err != nil {
		t.Fatal(err)
	}
	sides := map[string]int{}
	for _, p := range procs {
		want := workloadCPU
		if p.Side == world.SideHub {
			want = hubCPU
		}
		got, err := placement.Of(p.Pid)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s (pid %d, %s side) may run on CPUs %s (%v), want %s", p.Name, p.Pid, p.Side, got, err, want)
		}
		sides[p.Side]++
	}
	// API server, etcd, side process; API server, etcd, scheduler,
	// controller manager, side process.
	if sides[world.SideHub] != 3 || sides[world.SideWorkload] != 5 {
		t.Errorf("processes by side %v, want hub 3, workload 5: %+v", sides, procs)
	}

	if err := w.SetProvisionDelay(3 * time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := w.CreateAWSMachineTemplate(ctx, "m5-large", "m5.large", false); err != nil {
		t.Fatal(err)
	}
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: w.Namespace, Name: "md-split", ClusterName: w.ClusterName, InfraTemplate: "m5-large", Replicas: 1,
	})
	if err := w.Hub.Client.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	var node corev1.Node
	waitFor(ctx, t, 90*time.Second, "a simulated Node Ready", func(ctx context.Context) (bool, string, error) {
		ns, err := simulatedNodes(ctx, w.Spoke.Client)
		if err != nil || len(ns) != 1 {
			return false, fmt.Sprintf("%d Nodes", len(ns)), err
		}
		node = ns[0]
		return nodeReady(&node), fmt.Sprintf("Node %s conditions %v", node.Name, node.Status.Conditions), nil
	})
	// The instance stayed pending for the delay set through the hub side.
	if up := node.CreationTimestamp.Sub(md.CreationTimestamp.Time); up < 3*time.Second {
		t.Errorf("Node %s registered %s after its MachineDeployment, before the 3s provisioning delay", node.Name, up)
	}

	if err := w.Hub.Client.Patch(ctx, md, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":0}}`))); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 90*time.Second, "the Node gone", func(ctx context.Context) (bool, string, error) {
		err := w.Spoke.Client.Get(ctx, client.ObjectKeyFromObject(&node), &corev1.Node{})
		return client.IgnoreNotFound(err) == nil && err != nil, "Node " + node.Name + " still there", client.IgnoreNotFound(err)
	})
}
