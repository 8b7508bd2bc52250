package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	toolscache "k8s.io/client-go/tools/cache"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// A MachineDeployment's template changes (a new AWSMachineTemplate): every
// Karpenter node ends on the new template, within the NodePool's budget of
// one node at a time, a PodDisruptionBudget is never broken, and nothing is
// left over; with either rollout strategy. With OnDelete (recommended)
// Karpenter alone replaces the nodes; with RollingUpdate Cluster API
// replaces Machines too, and the Machines it creates are bound to
// Karpenter's replacements or given back.
func TestMachineDeploymentDriftRollsNodesOntoTheNewTemplate(t *testing.T) {
	for _, strategy := range []clusterv1.MachineDeploymentRolloutStrategyType{
		clusterv1.OnDeleteMachineDeploymentStrategyType,
		clusterv1.RollingUpdateMachineDeploymentStrategyType,
	} {
		t.Run(string(strategy), func(t *testing.T) { testMachineDeploymentDrift(t, strategy) })
	}
}

func testMachineDeploymentDrift(t *testing.T, strategy clusterv1.MachineDeploymentRolloutStrategyType) {
	const replicas = 3
	ctx := context.Background()
	name := "mdd-" + map[clusterv1.MachineDeploymentRolloutStrategyType]string{
		clusterv1.OnDeleteMachineDeploymentStrategyType:      "ondelete",
		clusterv1.RollingUpdateMachineDeploymentStrategyType: "rolling",
	}[strategy]
	app := name + "-app"
	pool(t, name)
	np := &karpv1.NodePool{}
	if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: name}, np); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(np.DeepCopy())
	np.Spec.Disruption.Budgets = []karpv1.Budget{{Nodes: "1"}}
	if err := w.Spoke.Client.Patch(ctx, np, patch); err != nil {
		t.Fatal(err)
	}

	if _, err := w.CreateAWSMachineTemplate(ctx, name+"-v1", "m5.large", false); err != nil {
		t.Fatal(err)
	}
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: w.Namespace, Name: name, ClusterName: w.ClusterName, Member: true, InfraTemplate: name + "-v1",
		Labels: map[string]string{"pool": name}, Annotations: map[string]string{v1alpha1.PriceAnnotation: "0.096"}, FailureDomain: "us-east-1c",
	})
	md.Spec.Rollout.Strategy.Type = strategy
	if err := w.Hub.Client.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	mds := []*clusterv1.MachineDeployment{md}

	deployment(t, name, app, replicas, "1500m") // one per node
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: app},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: &intstr.IntOrString{Type: intstr.Int, IntVal: replicas - 1},
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
		},
	}
	if err := w.Spoke.Client.Create(ctx, pdb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Spoke.Client.Delete(context.Background(), pdb) })
	waitCounts(t, 4*time.Minute, name, app, mds, func(c counts) bool {
		return c.RunningPods == replicas && c.Initialized == replicas && c.BoundMachines == replicas
	})
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		n, err := readyPods(ctx, app)
		return n == replicas, err
	}); err != nil {
		t.Fatalf("%d Ready pods: %v", replicas, err)
	}
	hashBefore := nodeClassDriftHash(t, name)

	// Watch the Ready pods, the NodeClaims and the Machines created while
	// the nodes are replaced.
	watchCtx, stopWatch := context.WithCancel(ctx)
	var mu sync.Mutex
	lowest, peakClaims, fewestNodes := replicas, replicas, replicas
	created := map[string]bool{}
	hubCache, _ := worldCaches(t)
	inf, err := hubCache.GetInformer(watchCtx, &clusterv1.Machine{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: func(o any) {
		if m, ok := o.(*clusterv1.Machine); ok && m.Labels[clusterv1.MachineDeploymentNameLabel] == name {
			mu.Lock()
			created[m.Name] = true
			mu.Unlock()
		}
	}}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = hubCache.Start(watchCtx) }()
	hubCache.WaitForCacheSync(watchCtx)
	mu.Lock()
	before := len(created)
	mu.Unlock()
	var watchDone sync.WaitGroup
	watchDone.Add(1)
	go func() {
		defer watchDone.Done()
		for watchCtx.Err() == nil {
			if n, err := readyPods(watchCtx, app); err == nil {
				mu.Lock()
				lowest = min(lowest, n)
				mu.Unlock()
			}
			claims := &karpv1.NodeClaimList{}
			if err := w.Spoke.Client.List(watchCtx, claims, client.MatchingLabels{karpv1.NodePoolLabelKey: name}); err == nil {
				mu.Lock()
				peakClaims = max(peakClaims, len(claims.Items))
				mu.Unlock()
			}
			if n, err := schedulableNodes(watchCtx, name); err == nil {
				mu.Lock()
				fewestNodes = min(fewestNodes, n)
				mu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()

	// The new template: same instance type, another AWSMachineTemplate.
	if _, err := w.CreateAWSMachineTemplate(ctx, name+"-v2", "m5.large", false); err != nil {
		t.Fatal(err)
	}
	cur := &clusterv1.MachineDeployment{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
		t.Fatal(err)
	}
	mdPatch := client.MergeFrom(cur.DeepCopy())
	cur.Spec.Template.Spec.InfrastructureRef.Name = name + "-v2"
	if err := w.Hub.Client.Patch(ctx, cur, mdPatch); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := WaitFor(ctx, time.Minute, func(context.Context) (bool, error) {
		return nodeClassDriftHash(t, name) != hashBefore, nil
	}); err != nil {
		t.Fatalf("the NodeClass's driftHash did not change with the template: %v", err)
	}

	var last string
	err = WaitFor(ctx, 6*time.Minute, func(ctx context.Context) (bool, error) {
		onNew, onOld, err := machinesByTemplate(ctx, name, name+"-v2")
		if err != nil {
			return false, err
		}
		c, err := count(ctx, name, app, mds...)
		if err != nil {
			return false, err
		}
		ready, err := readyPods(ctx, app)
		if err != nil {
			return false, err
		}
		now := fmt.Sprintf("on new template %d, on old %d, ready pods %d; %s", onNew, onOld, ready, c)
		if now != last {
			// The timeline of the replacement: where a slow one spent its time.
			t.Logf("%6s %s", time.Since(start).Round(100*time.Millisecond), now)
		}
		last = now
		return onNew == replicas && onOld == 0 && ready == replicas && c.NodeClaims == replicas && c.BoundMachines == replicas &&
			c.Machines == replicas && c.Replicas == replicas && c.Pending == 0, nil
	})
	stopWatch()
	watchDone.Wait()
	if err != nil {
		t.Logf("nodes not all on the new template: %v (last: %s)", err, last)
		logSpokeEvents(t, name)
		logHubMachines(t, name)
		t.Fatalf("nodes not all on the new template: %v (last: %s)", err, last)
	}
	mu.Lock()
	newMachines, low, peak, fewest := len(created)-before, lowest, peakClaims, fewestNodes
	mu.Unlock()
	t.Logf("%s: all nodes on the new template after %s: %s; %d Machines created, at most %d NodeClaims at once, at least %d Ready pods, at least %d schedulable nodes",
		strategy, time.Since(start).Round(time.Second), last, newMachines, peak, low, fewest)
	if low < replicas-1 {
		t.Fatalf("Ready pods dropped to %d during the replacement; the PodDisruptionBudget asks for %d", low, replicas-1)
	}
	// With OnDelete only Karpenter replaces nodes, within its budget (one
	// node out of service at a time), with one new Machine each.
	if strategy == clusterv1.OnDeleteMachineDeploymentStrategyType && (fewest < replicas-1 || newMachines != replicas) {
		t.Fatalf("OnDelete: %d schedulable nodes at worst and %d new Machines; want at least %d and exactly %d", fewest, newMachines, replicas-1, replicas)
	}
	// Nothing left over and nothing more happens after the grace period.
	holdCounts(t, machinedeployment.OrphanGrace+5*time.Second, name, app, mds, func(c counts) bool {
		return c.Machines == replicas && c.BoundMachines == replicas && c.Replicas == replicas && c.NodeClaims == replicas
	})
	cur = &clusterv1.MachineDeployment{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
		t.Fatal(err)
	}
	if v := cur.Annotations[machinedeployment.OwnedReplicasAnnotation]; v != fmt.Sprint(replicas) {
		t.Fatalf("owned replicas %q, want %d", v, replicas)
	}
}

// machinesByTemplate counts the pool's live Machines whose MachineSet uses
// the infrastructure template and those whose MachineSet does not.
func machinesByTemplate(ctx context.Context, mdName, template string) (onNew, onOld int, err error) {
	ms := &clusterv1.MachineList{}
	if err := w.Hub.Client.List(ctx, ms, client.InNamespace(w.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: mdName}); err != nil {
		return 0, 0, err
	}
	sets := &clusterv1.MachineSetList{}
	if err := w.Hub.Client.List(ctx, sets, client.InNamespace(w.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: mdName}); err != nil {
		return 0, 0, err
	}
	templateOf := map[string]string{}
	for _, s := range sets.Items {
		templateOf[s.Name] = s.Spec.Template.Spec.InfrastructureRef.Name
	}
	for _, m := range ms.Items {
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		owner := ""
		for _, ref := range m.OwnerReferences {
			if ref.Kind == "MachineSet" {
				owner = ref.Name
			}
		}
		if templateOf[owner] == template {
			onNew++
		} else {
			onOld++
		}
	}
	return onNew, onOld, nil
}

func nodeClassDriftHash(t *testing.T, name string) string {
	t.Helper()
	nc := &v1alpha1.ClusterAPINodeClass{}
	if err := w.Spoke.Client.Get(context.Background(), client.ObjectKey{Name: name}, nc); err != nil {
		t.Fatal(err)
	}
	return nc.Status.DriftHash
}

// schedulableNodes counts the pool's Nodes that take pods: Ready, not being
// deleted, not cordoned and not tainted as disrupted by Karpenter.
func schedulableNodes(ctx context.Context, pool string) (int, error) {
	nodes := &corev1.NodeList{}
	if err := w.Spoke.Client.List(ctx, nodes, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
		return 0, err
	}
	n := 0
	for _, node := range nodes.Items {
		if !node.DeletionTimestamp.IsZero() || node.Spec.Unschedulable {
			continue
		}
		disrupted := false
		for _, taint := range node.Spec.Taints {
			if taint.Key == karpv1.DisruptedTaintKey {
				disrupted = true
			}
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && !disrupted {
				n++
			}
		}
	}
	return n, nil
}
