package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
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

	// Watch the Ready pods while the nodes are replaced.
	watchCtx, stopWatch := context.WithCancel(ctx)
	var mu sync.Mutex
	lowest := replicas
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
	err := WaitFor(ctx, 6*time.Minute, func(ctx context.Context) (bool, error) {
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
		last = fmt.Sprintf("on new template %d, on old %d, ready pods %d; %s", onNew, onOld, ready, c)
		return onNew == replicas && onOld == 0 && ready == replicas && c.NodeClaims == replicas && c.BoundMachines == replicas &&
			c.Machines == replicas && c.Replicas == replicas && c.Pending == 0, nil
	})
	stopWatch()
	watchDone.Wait()
	if err != nil {
		logSpokeEvents(t, name)
		t.Fatalf("nodes not all on the new template: %v (last: %s)", err, last)
	}
	t.Logf("%s: all nodes on the new template after %s: %s", strategy, time.Since(start).Round(time.Second), last)
	mu.Lock()
	if lowest < replicas-1 {
		mu.Unlock()
		t.Fatalf("Ready pods dropped to %d during the replacement; the PodDisruptionBudget asks for %d", lowest, replicas-1)
	}
	mu.Unlock()
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
