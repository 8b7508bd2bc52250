package e2eusers

import (
	"context"
	"testing"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/test/world"
)

// clusterFromTemplate makes a Cluster the way a clusterctl user does:
// `clusterctl generate cluster NAME --flavor FLAVOUR` with the variables of
// testdata/clusterctl.yaml, CAPA's published template read unchanged from
// the CAPA module, then the docs' edits (patch files under examples/),
// applied to the hub. It returns once Cluster API sees the Cluster ready.
func clusterFromTemplate(t *testing.T, name, flavour string, patchFiles ...string) (Values, []clusterv1.MachineDeployment) {
	t.Helper()
	ctx := context.Background()
	wcValues := values(t, name)
	path, err := CAPATemplate(flavour)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Render(path, wcValues, w.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range patchFiles {
		if err := ApplyPatches(objs, ExampleFile(p), wcValues); err != nil {
			t.Fatal(err)
		}
	}
	createAll(t, w.Hub.Client, objs)
	start := time.Now()
	if err := w.WaitClusterReady(ctx, name); err != nil {
		t.Fatal(err)
	}
	t.Logf("Cluster %s from %s ready after %s (%d objects)", name, path, time.Since(start).Round(100*time.Millisecond), len(objs))
	mds := &clusterv1.MachineDeploymentList{}
	if err := w.Hub.Client.List(ctx, mds, client.InNamespace(w.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: name}); err != nil {
		t.Fatal(err)
	}
	return wcValues, mds.Items
}

// CAPA's cluster-template.yaml, as published, with the MachineDeployment
// edits of docs/clusterctl.md: its worker MachineDeployment (no failure
// domain: an offering without a zone) scales up and down exactly.
func TestClusterctlTemplateMachineDeploymentMode(t *testing.T) {
	t.Parallel() // each has a Cluster and workload cluster of its own
	const name = "capa-default"
	wc, err := w.PrepareCluster(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	v, mds := clusterFromTemplate(t, name, "", "capa-templates/clusterctl/karpenter.patch.yaml")
	if len(mds) != 1 || mds[0].Spec.Template.Spec.FailureDomain != "" {
		t.Fatalf("CAPA's template has one worker MachineDeployment without a failure domain, got %d", len(mds))
	}
	startProvider(t, wc)
	applyWorkload(t, wc, "capa-templates/clusterctl/workload.yaml", v)
	waitNodeClassReady(t, wc, "workers")

	scaleUpAndDown(t, wc, "workers", 4, nil)
}

// CAPA's -flatcar flavour (Ignition bootstrap, an S3 bucket on the
// AWSCluster): the same worker pool, the same edits, the same result.
func TestClusterctlFlatcarFlavourMachineDeploymentMode(t *testing.T) {
	t.Parallel() // each has a Cluster and workload cluster of its own
	const name = "capa-flatcar"
	wc, err := w.PrepareCluster(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	v, mds := clusterFromTemplate(t, name, "flatcar", "capa-templates/clusterctl/karpenter.patch.yaml")
	if len(mds) != 1 {
		t.Fatalf("CAPA's -flatcar template has one worker MachineDeployment, got %d", len(mds))
	}
	startProvider(t, wc)
	applyWorkload(t, wc, "capa-templates/clusterctl/workload.yaml", v)
	waitNodeClassReady(t, wc, "workers")
	scaleUpAndDown(t, wc, "workers", 2, nil)
}

// scaleUpAndDown runs n pods that each need a node of the pool, expects
// exactly n NodeClaims, Nodes and Machines and no failed launch, then
// removes the pods and expects all of them gone.
func scaleUpAndDown(t *testing.T, wc *world.WorkloadCluster, pool string, n int32, machines client.MatchingLabels) {
	t.Helper()
	app := "app-" + pool
	ta := newTally(wc, pool, app, machines)
	d := deployment(t, wc, pool, app, n, "1500m") // one per 2-vCPU node
	start := time.Now()
	// A NodeClaim of an offering without a zone learns its zone from its
	// Node, a moment after the Node registers: wait for it too (a NodeClaim
	// that never gets one times out here).
	got := ta.wait(t, 4*time.Minute, func(c counts) bool {
		return c.RunningPods == int(n) && c.Nodes == int(n) && c.Zones[""] == 0
	})
	t.Logf("%d pods running after %s: %s", n, time.Since(start).Round(100*time.Millisecond), got)
	if got.NodeClaims != int(n) || got.Machines != int(n) || got.EverNodeClaims != int(n) {
		t.Fatalf("want exactly %d NodeClaims, Nodes and Machines and no failed launch, got %s", n, got)
	}
	for _, z := range sortedKeys(got.Zones) {
		if !validZone(z) {
			t.Fatalf("NodeClaims carry zone %q, not one of the Cluster's: %s", z, got)
		}
	}
	scale(t, wc, d, 0)
	start = time.Now()
	got = ta.wait(t, 4*time.Minute, func(c counts) bool { return c.NodeClaims == 0 && c.Nodes == 0 && c.Machines == 0 })
	t.Logf("scaled to zero after %s", time.Since(start).Round(100*time.Millisecond))
}

func validZone(z string) bool {
	for _, x := range w.AWS.Zones() {
		if x == z {
			return true
		}
	}
	return false
}
