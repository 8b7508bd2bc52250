package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// A NodeClaim on the new MachineSet of an OnDelete rollout goes (as
// consolidation or a person deletes it) while the old MachineSet still
// holds running Karpenter nodes. Cluster API's OnDelete rollout takes a
// lowering of spec.replicas off the oldest out-of-date MachineSet, so the
// provider must not lower for that Machine: a running node of the old
// MachineSet would go instead. Real Cluster API decides which Machine goes.
func TestAnOnDeleteRolloutNeverCostsARunningNodeOfTheOldMachineSet(t *testing.T) {
	ctx := context.Background()
	const name = "mdr-ondelete"
	app := name + "-app"
	pool(t, name)
	// No disruption of Karpenter's own (drift would replace the old nodes):
	// only the deletion below removes a node.
	budget(t, name, "0")
	for _, v := range []string{"-v1", "-v2"} {
		if _, err := w.CreateAWSMachineTemplate(ctx, name+v, "m5.large", false); err != nil {
			t.Fatal(err)
		}
	}
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: w.Namespace, Name: name, ClusterName: w.ClusterName, Member: true, InfraTemplate: name + "-v1",
		Labels: map[string]string{"pool": name}, Annotations: map[string]string{v1alpha1.PriceAnnotation: "0.096"}, FailureDomain: "us-east-1c",
	})
	md.Spec.Rollout.Strategy.Type = clusterv1.OnDeleteMachineDeploymentStrategyType
	if err := w.Hub.Client.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	mds := []*clusterv1.MachineDeployment{md}

	// Two nodes on the first template.
	d := deployment(t, name, app, 2, "1500m") // one per node
	waitCounts(t, 4*time.Minute, name, app, mds, func(c counts) bool {
		return c.RunningPods == 2 && c.Initialized == 2 && c.BoundMachines == 2
	})
	old, err := mdMachines(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	kept := map[string]string{} // Machine -> its NodeClaim
	for _, m := range old {
		kept[m.Name] = m.Annotations[v1alpha1.NodeClaimAnnotation]
	}

	// Watch the old Machines: none may be deleted from here on.
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var mu sync.Mutex
	removed := map[string]bool{}
	hubCache, _ := worldCaches(t)
	inf, err := hubCache.GetInformer(watchCtx, &clusterv1.Machine{})
	if err != nil {
		t.Fatal(err)
	}
	note := func(o any) {
		if m, ok := o.(*clusterv1.Machine); ok && !m.DeletionTimestamp.IsZero() {
			if _, old := kept[m.Name]; old {
				mu.Lock()
				removed[m.Name] = true
				mu.Unlock()
			}
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, o any) { note(o) },
		DeleteFunc: func(o any) {
			if m, ok := o.(*clusterv1.Machine); ok {
				if _, old := kept[m.Name]; old {
					mu.Lock()
					removed[m.Name] = true
					mu.Unlock()
				}
			}
		},
	}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = hubCache.Start(watchCtx) }()
	hubCache.WaitForCacheSync(watchCtx)

	// The rollout starts: a new template, a new MachineSet.
	cur := &clusterv1.MachineDeployment{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
		t.Fatal(err)
	}
	mdPatch := client.MergeFrom(cur.DeepCopy())
	cur.Spec.Template.Spec.InfrastructureRef.Name = name + "-v2"
	if err := w.Hub.Client.Patch(ctx, cur, mdPatch); err != nil {
		t.Fatal(err)
	}
	// A third node: its Machine comes from the new MachineSet.
	scaleDeployment(t, d, 3)
	waitCounts(t, 4*time.Minute, name, app, mds, func(c counts) bool {
		return c.RunningPods == 3 && c.Initialized == 3 && c.BoundMachines == 3
	})
	onNew, onOld, err := machinesByTemplate(ctx, name, name+"-v2")
	if err != nil || onNew != 1 || onOld != 2 {
		t.Fatalf("Machines on the new template %d, on the old %d (want 1 and 2): %v", onNew, onOld, err)
	}
	var third, thirdClaim string
	all, err := mdMachines(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range all {
		if _, old := kept[m.Name]; !old && m.DeletionTimestamp.IsZero() {
			third, thirdClaim = m.Name, m.Annotations[v1alpha1.NodeClaimAnnotation]
		}
	}
	if thirdClaim == "" {
		t.Fatalf("no NodeClaim bound to the new MachineSet's Machine %q", third)
	}

	// The new node's NodeClaim goes. Its pod comes back Pending and gets a
	// node again; the two old nodes stay.
	start := time.Now()
	if err := w.Spoke.Client.Delete(ctx, &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: thirdClaim}}); err != nil {
		t.Fatal(err)
	}
	waitCounts(t, 4*time.Minute, name, app, mds, func(c counts) bool {
		if c.RunningPods != 3 || c.NodeClaims != 3 || c.BoundMachines != 3 {
			return false
		}
		ms, err := mdMachines(ctx, name)
		if err != nil {
			return false
		}
		for _, m := range ms {
			if m.Name == third {
				return false // still there
			}
		}
		return true
	})
	t.Logf("the new MachineSet's node replaced in %s", time.Since(start).Round(100*time.Millisecond))
	oldRemoved := func() {
		mu.Lock()
		defer mu.Unlock()
		if len(removed) > 0 {
			logHubMachines(t, name)
			t.Fatalf("Machines of the old MachineSet removed: %v (their NodeClaims were not deleted: Cluster API lowered the old MachineSet for a release on the new one)", removed)
		}
	}
	oldRemoved()
	// While the rollout lasts the old nodes stay, bound to their
	// NodeClaims. The released node's replica stays up (Cluster API would
	// take it off the old MachineSet): at most one Machine beyond the
	// NodeClaims, unbound, which the next NodeClaim takes.
	holdCounts(t, machinedeployment.OrphanGrace+5*time.Second, name, app, mds, func(c counts) bool {
		return c.RunningPods == 3 && c.NodeClaims == 3 && c.BoundMachines == 3 && c.Machines <= 4 && c.Replicas <= 4
	})
	oldRemoved()
	stopWatch()
	for m, claim := range kept {
		got := &clusterv1.Machine{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: w.Namespace, Name: m}, got); err != nil {
			t.Fatalf("Machine %s of the old MachineSet: %v", m, err)
		}
		if got.Annotations[v1alpha1.NodeClaimAnnotation] != claim || !got.DeletionTimestamp.IsZero() {
			t.Fatalf("Machine %s bound to %q (deleting %v), want %q", m, got.Annotations[v1alpha1.NodeClaimAnnotation], !got.DeletionTimestamp.IsZero(), claim)
		}
	}

	// The rollout ends as Karpenter drives it: drift replaces the old
	// nodes (one at a time), and nothing is left over.
	budget(t, name, "1")
	if err := WaitFor(ctx, 6*time.Minute, func(ctx context.Context) (bool, error) {
		onNew, onOld, err := machinesByTemplate(ctx, name, name+"-v2")
		if err != nil {
			return false, err
		}
		c, err := count(ctx, name, app, mds...)
		if err != nil {
			return false, err
		}
		return onNew == 3 && onOld == 0 && c.RunningPods == 3 && c.NodeClaims == 3 && c.BoundMachines == 3 && c.Machines == 3 && c.Replicas == 3 && c.Pending == 0, nil
	}); err != nil {
		logHubMachines(t, name)
		t.Fatalf("the rollout did not end with 3 nodes on the new template and nothing left over: %v", err)
	}
	holdCounts(t, machinedeployment.OrphanGrace+5*time.Second, name, app, mds, func(c counts) bool {
		return c.RunningPods == 3 && c.NodeClaims == 3 && c.BoundMachines == 3 && c.Machines == 3 && c.Replicas == 3
	})
}

// mdMachines lists a MachineDeployment's Machines in the hub.
func mdMachines(ctx context.Context, md string) ([]clusterv1.Machine, error) {
	list := &clusterv1.MachineList{}
	if err := w.Hub.Client.List(ctx, list, client.InNamespace(w.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md}); err != nil {
		return nil, fmt.Errorf("listing Machines of MachineDeployment %s: %w", md, err)
	}
	return list.Items, nil
}

// budget sets a NodePool's only disruption budget to nodes.
func budget(t testing.TB, pool, nodes string) {
	t.Helper()
	ctx := context.Background()
	np := &karpv1.NodePool{}
	if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: pool}, np); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(np.DeepCopy())
	np.Spec.Disruption.Budgets = []karpv1.Budget{{Nodes: nodes}}
	if err := w.Spoke.Client.Patch(ctx, np, patch); err != nil {
		t.Fatal(err)
	}
}
