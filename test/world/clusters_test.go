package world_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// testSecondCluster adds a Cluster with its own workload cluster: its
// MachineDeployment's Machines join its spoke, never the first one's.
func testSecondCluster(ctx context.Context, t *testing.T, w *world.World) {
	start := time.Now()
	c2, err := w.AddCluster(ctx, "c2")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Cluster c2 added in %s", time.Since(start).Round(100*time.Millisecond))
	if _, err := w.AddCluster(ctx, "c2"); err == nil {
		t.Fatal("adding Cluster c2 twice must fail")
	}
	hub := w.Hub.Client
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: w.Namespace, Name: "md-c2", ClusterName: c2.Name, InfraTemplate: "m5-large", Replicas: 2, FailureDomain: "us-east-1b",
	})
	start = time.Now()
	if err := hub.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	var nodes []corev1.Node
	waitFor(ctx, t, 90*time.Second, "2 Ready Nodes in c2's workload cluster", func(ctx context.Context) (bool, string, error) {
		var err error
		if nodes, err = simulatedNodes(ctx, c2.Spoke.Client); err != nil {
			return false, "", err
		}
		ms, err := machinesOf(ctx, hub, w.Namespace, "md-c2")
		if err != nil {
			return false, "", err
		}
		running := 0
		for _, m := range ms {
			if m.Status.Phase == string(clusterv1.MachinePhaseRunning) && m.Status.NodeRef.IsDefined() {
				running++
			}
		}
		ready := 0
		for _, n := range nodes {
			if nodeReady(&n) {
				ready++
			}
		}
		return ready == 2 && running == 2, fmt.Sprintf("%d Nodes ready, %s", ready, describeMachines(ms)), nil
	})
	t.Logf("2 Machines of c2 Running with Ready Nodes %s after creating the MachineDeployment", time.Since(start).Round(100*time.Millisecond))
	first, err := simulatedNodes(ctx, w.Spoke.Client)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		for _, f := range first {
			if f.Spec.ProviderID == n.Spec.ProviderID {
				t.Errorf("instance %s of c2 joined the first Cluster's spoke too", n.Spec.ProviderID)
			}
		}
	}
	for _, in := range w.AWS.Instances() {
		if in.ClusterName != c2.Name {
			t.Errorf("instance %s of Machine %s: ClusterName %q, want c2", in.ID, in.Machine, in.ClusterName)
		}
	}
	if err := hub.Delete(ctx, md); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 90*time.Second, "c2's Machines and Nodes gone", func(ctx context.Context) (bool, string, error) {
		ms, err := machinesOf(ctx, hub, w.Namespace, "md-c2")
		if err != nil {
			return false, "", err
		}
		ns, err := simulatedNodes(ctx, c2.Spoke.Client)
		return len(ms) == 0 && len(ns) == 0, fmt.Sprintf("%d Machines, %d Nodes", len(ms), len(ns)), err
	})
}

// testHubOutage kills the hub's API server and starts it again: clients get
// errors (never NotFound) meanwhile, the audit log keeps recording, Cluster
// API and the simulators resume on their own.
func testHubOutage(ctx context.Context, t *testing.T, w *world.World) {
	hub := w.Hub.Client
	u, err := w.Hub.Env.ControlPlane.AddUser(envtest.User{Name: "audited", Groups: []string{world.AuditedGroup}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	audited, err := client.New(u.Config(), client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: w.Namespace, Name: "md-outage", ClusterName: w.ClusterName, InfraTemplate: "m5-large", Replicas: 1, FailureDomain: "us-east-1c",
	})
	if err := hub.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	readyNodes := func(want int) func(context.Context) (bool, string, error) {
		return func(ctx context.Context) (bool, string, error) {
			ms, err := machinesOf(ctx, hub, w.Namespace, "md-outage")
			if err != nil {
				return false, "", err
			}
			running := 0
			for _, m := range ms {
				if m.Status.Phase == string(clusterv1.MachinePhaseRunning) && m.Status.NodeRef.IsDefined() {
					running++
				}
			}
			return running == want, describeMachines(ms), nil
		}
	}
	waitFor(ctx, t, 90*time.Second, "1 Running Machine", readyNodes(1))
	// Only the audited user's requests are logged.
	if err := audited.List(ctx, &clusterv1.MachineList{}, client.InNamespace(w.Namespace)); apierrors.IsForbidden(err) {
		t.Log("the audited user has no RBAC: its request is logged anyway")
	}

	start := time.Now()
	if err := w.StopHubAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Logf("hub API server killed in %s", time.Since(start).Round(time.Millisecond))
	err = hub.Get(ctx, client.ObjectKeyFromObject(md), md)
	if err == nil || apierrors.IsNotFound(err) {
		t.Fatalf("reading from a hub without API server: %v, want a connection error", err)
	}
	if err := w.StopHubAPIServer(); err == nil {
		t.Error("stopping a stopped hub API server must fail")
	}
	start = time.Now()
	if err := w.StartHubAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("hub API server ready %s after its restart", time.Since(start).Round(time.Millisecond))

	// The controllers work again: scale up.
	start = time.Now()
	if err := hub.Get(ctx, client.ObjectKeyFromObject(md), md); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(md.DeepCopy())
	md.Spec.Replicas = ptr.To[int32](2)
	if err := hub.Patch(ctx, md, patch); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 90*time.Second, "2 Running Machines after the restart", readyNodes(2))
	t.Logf("scaled up %s after the restart", time.Since(start).Round(100*time.Millisecond))
	_ = audited.List(ctx, &clusterv1.MachineList{}, client.InNamespace(w.Namespace))

	events, err := w.HubAudit()
	if err != nil {
		t.Fatal(err)
	}
	var lists int
	for _, e := range events {
		if e.User.Username != "audited" {
			t.Errorf("audit log records a request of %q (%s %s): only %s's users are audited", e.User.Username, e.Verb, e.RequestURI, world.AuditedGroup)
		}
		if e.Verb == "list" && e.ObjectRef != nil && e.ObjectRef.Resource == "machines" && strings.Contains(e.RequestURI, "/namespaces/"+w.Namespace+"/") {
			lists++
		}
	}
	if lists < 2 { // ResponseComplete of each (before and after the restart)
		t.Errorf("want the audited user's 2 lists in the audit log, got %d of %d events", lists, len(events))
	}
	if err := hub.Delete(ctx, md); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 90*time.Second, "the Machines gone", readyNodes(0))
}
