package e2e

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/failpoint"
	"github.com/autonode/karpenter-clusterapi/pkg/machine"
)

// readyPods counts the app's Ready pods that are not terminating.
func readyPods(ctx context.Context, app string) (int, error) {
	pods := &corev1.PodList{}
	if err := w.Spoke.Client.List(ctx, pods, client.MatchingLabels{"app": app}); err != nil {
		return 0, err
	}
	n := 0
	for _, p := range pods.Items {
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				n++
			}
		}
	}
	return n, nil
}

// Drift: the template the nodes were cloned from stops being eligible and a
// new one takes its place; Karpenter replaces every node within the
// NodePool's budget, and the PodDisruptionBudget is never broken.
func TestMachineModeDriftReplacesNodesWithinBudgets(t *testing.T) {
	ctx := context.Background()
	machinePool(t, "drift", machinePoolOptions{Budget: "1"})
	old := memberTemplate(t, "drift", "drift-v1", "m5.large", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	workload(t, "drift", "drift-app", 3, "1500m", "", nil)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "drift-app"},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: &intstr.IntOrString{Type: intstr.Int, IntVal: 2},
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "drift-app"}},
		},
	}
	if err := w.Spoke.Client.Create(ctx, pdb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Spoke.Client.Delete(context.Background(), pdb) })
	waitAppNodes(t, 4*time.Minute, "drift-app", 3)
	err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		n, err := readyPods(ctx, "drift-app")
		return n == 3, err
	})
	if err != nil {
		t.Fatalf("3 Ready pods: %v", err)
	}

	// Watch the Ready pods while the nodes are replaced.
	watchCtx, stopWatch := context.WithCancel(ctx)
	var mu sync.Mutex
	lowest := 3
	var watchDone sync.WaitGroup
	watchDone.Add(1)
	go func() {
		defer watchDone.Done()
		for watchCtx.Err() == nil {
			if n, err := readyPods(watchCtx, "drift-app"); err == nil {
				mu.Lock()
				lowest = min(lowest, n)
				mu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()

	memberTemplate(t, "drift", "drift-v2", "m5.large", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	cur := old.DeepCopy()
	if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(old), cur); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	delete(cur.Labels, v1alpha1.KarpenterMemberLabel)
	if err := w.Hub.Client.Patch(ctx, cur, patch); err != nil {
		t.Fatal(err)
	}
	start := time.Now()

	var last string
	err = WaitFor(ctx, 4*time.Minute, func(ctx context.Context) (bool, error) {
		ms, err := poolMachines(ctx, "drift")
		if err != nil {
			return false, err
		}
		onNew := 0
		for _, m := range ms {
			if o, err := machine.ParseOffering(m.Annotations[v1alpha1.OfferingAnnotation]); err == nil && o.Template.Name == "drift-v2" && m.DeletionTimestamp.IsZero() {
				onNew++
			}
		}
		ready, err := readyPods(ctx, "drift-app")
		if err != nil {
			return false, err
		}
		claims := &karpv1.NodeClaimList{}
		if err := w.Spoke.Client.List(ctx, claims, client.MatchingLabels{karpv1.NodePoolLabelKey: "drift"}); err != nil {
			return false, err
		}
		last = "machines=" + strconv.Itoa(len(ms)) + " onNew=" + strconv.Itoa(onNew) + " readyPods=" + strconv.Itoa(ready) + " nodeClaims=" + strconv.Itoa(len(claims.Items))
		return len(ms) == 3 && onNew == 3 && ready == 3 && len(claims.Items) == 3, nil
	})
	stopWatch()
	watchDone.Wait()
	if err != nil {
		logSpokeEvents(t, "drift")
		t.Fatalf("nodes were not all replaced onto template drift-v2: %v (last %s)", err, last)
	}
	t.Logf("all nodes replaced onto the new template after %s", time.Since(start).Round(time.Second))
	mu.Lock()
	defer mu.Unlock()
	if lowest < 2 {
		t.Fatalf("Ready pods dropped to %d during the replacement; the PodDisruptionBudget asks for 2", lowest)
	}
}

// A launch interrupted after each of its steps (Machine, bootstrap config,
// infrastructure machine) resumes after a restart: exactly one Machine per
// NodeClaim, its parts made, and nothing left over.
func TestMachineModeCrashAtEachLaunchStep(t *testing.T) {
	ctx := context.Background()
	if _, err := w.CreateKubeadmConfigTemplate(ctx, "crash-bootstrap", nil); err != nil {
		t.Fatal(err)
	}
	for _, step := range []string{machine.StepInfrastructure, machine.StepBootstrap, machine.StepMachine} {
		t.Run(step, func(t *testing.T) {
			name := "crash-" + step
			machinePool(t, name, machinePoolOptions{Bootstrap: &v1alpha1.Bootstrap{ConfigRef: &v1alpha1.TemplateReference{
				APIGroup: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfigTemplate", Name: "crash-bootstrap",
			}}})
			memberTemplate(t, name, name+"-m5", "m5.large", map[string]string{v1alpha1.PriceAnnotation: "0.096"})

			provider.Kill()
			crashing, err := StartProviderWithEnv(bin, w, "provider.log", []string{failpoint.CrashAfterEnv + "=" + step})
			if err != nil {
				t.Fatal(err)
			}
			provider = crashing
			workload(t, name, name+"-app", 1, "1500m", "", nil)
			if err := WaitFor(ctx, 2*time.Minute, func(context.Context) (bool, error) { return crashing.Exited(), nil }); err != nil {
				t.Fatalf("the provider did not stop after the %s step: %v", step, err)
			}
			restarted, err := StartProvider(bin, w, "provider.log")
			if err != nil {
				t.Fatal(err)
			}
			provider = restarted

			waitAppNodes(t, 4*time.Minute, name+"-app", 1)
			ms, err := poolMachines(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			ncs := &karpv1.NodeClaimList{}
			if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: name}); err != nil {
				t.Fatal(err)
			}
			if len(ms) != 1 || len(ncs.Items) != 1 {
				t.Fatalf("want 1 Machine and 1 NodeClaim, got %d and %d", len(ms), len(ncs.Items))
			}
			if ms[0].Annotations[v1alpha1.NodeClaimAnnotation] != ncs.Items[0].Name {
				t.Fatalf("Machine %s is bound to %q, the NodeClaim is %s", ms[0].Name, ms[0].Annotations[v1alpha1.NodeClaimAnnotation], ncs.Items[0].Name)
			}
			// Every infrastructure machine and bootstrap config the provider
			// made belongs to a Machine.
			err = WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
				n, err := managedLeftovers(ctx, awsMachineListGVK, bootstrapv1.GroupVersion.WithKind("KubeadmConfigList"))
				return n == 0, err
			})
			if err != nil {
				t.Fatalf("infrastructure machines or bootstrap configs without a Machine remain: %v", err)
			}
			cfgs := &bootstrapv1.KubeadmConfigList{}
			if err := w.Hub.Client.List(ctx, cfgs, client.InNamespace(w.Namespace), client.MatchingLabels{v1alpha1.ManagedLabel: "true", clusterv1.ClusterNameLabel: w.ClusterName}); err != nil {
				t.Fatal(err)
			}
			mine := 0
			for _, c := range cfgs.Items {
				if c.Annotations[v1alpha1.NodeClaimAnnotation] == ncs.Items[0].Name {
					mine++
				}
			}
			if mine != 1 {
				t.Fatalf("want 1 KubeadmConfig for NodeClaim %s, got %d", ncs.Items[0].Name, mine)
			}
		})
	}
}

// logSpokeEvents logs the workload cluster's events about objects whose name
// starts with prefix (the test's NodePool, its NodeClaims and Nodes), to
// explain a failure. Other tests' objects are left out: the world is shared
// and their events would bury the failure.
func logSpokeEvents(t testing.TB, prefix string) {
	t.Helper()
	events := &corev1.EventList{}
	if err := w.Spoke.Client.List(context.Background(), events); err != nil {
		t.Logf("listing events: %v", err)
		return
	}
	for _, e := range events.Items {
		if strings.HasPrefix(e.InvolvedObject.Name, prefix) {
			t.Logf("event %s %s/%s: %s %s", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
}

// Garbage collection in Machine mode: a Karpenter Machine whose NodeClaim is
// gone is deleted after the grace period, and so is an infrastructure
// machine the provider made for a launch that never got its Machine; a
// Machine without the member label is never touched.
func TestMachineModeGarbageCollection(t *testing.T) {
	ctx := context.Background()
	machinePool(t, "gc", machinePoolOptions{})
	memberTemplate(t, "gc", "gc-m5", "m5.large", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	offering := w.Namespace + "/gc-m5/us-east-1a/on-demand"
	newMachine := func(name string, member bool) *clusterv1.Machine {
		m := &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: w.Namespace, Name: name,
				Labels: map[string]string{clusterv1.ClusterNameLabel: w.ClusterName, "pool": "gc"},
				Annotations: map[string]string{
					v1alpha1.NodeClaimAnnotation: "gc-vanished", v1alpha1.OfferingAnnotation: offering,
					v1alpha1.InstanceTypeAnnotation: "m5.large",
				},
			},
			Spec: clusterv1.MachineSpec{
				ClusterName: w.ClusterName, Version: "v1.36.3", FailureDomain: "us-east-1a",
				Bootstrap:         clusterv1.Bootstrap{DataSecretName: &w.BootstrapSecretName},
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "AWSMachine", Name: name},
			},
		}
		if member {
			m.Labels[v1alpha1.KarpenterMemberLabel] = ""
		}
		if err := w.Hub.Client.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	orphan := newMachine("c1-gc-orphan", true)
	foreign := newMachine("c1-gc-foreign", false)
	t.Cleanup(func() { _ = w.Hub.Client.Delete(context.Background(), foreign) })

	// A leftover: an infrastructure machine made for a NodeClaim that is
	// gone, with no Machine.
	leftover := &unstructured.Unstructured{}
	leftover.SetGroupVersionKind(awsMachineListGVK.GroupVersion().WithKind("AWSMachine"))
	leftover.SetNamespace(w.Namespace)
	leftover.SetName("c1-gc-leftover")
	leftover.SetLabels(map[string]string{v1alpha1.ManagedLabel: "true", clusterv1.ClusterNameLabel: w.ClusterName})
	leftover.SetAnnotations(map[string]string{v1alpha1.NodeClaimAnnotation: "gc-vanished-too", v1alpha1.OfferingAnnotation: offering})
	if err := unstructured.SetNestedField(leftover.Object, "m5.large", "spec", "instanceType"); err != nil {
		t.Fatal(err)
	}
	if err := w.Hub.Client.Create(ctx, leftover); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	gone := func(obj client.Object) (bool, error) {
		err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, client.IgnoreNotFound(err)
	}
	if err := WaitFor(ctx, time.Duration(float64(machine.OrphanGrace)*1.5)+30*time.Second, func(context.Context) (bool, error) {
		return gone(orphan)
	}); err != nil {
		t.Fatalf("the orphaned Machine was not deleted: %v", err)
	}
	if took := time.Since(start); took < machine.OrphanGrace {
		t.Fatalf("the orphaned Machine was deleted after %s, before the grace period %s", took, machine.OrphanGrace)
	}
	t.Logf("orphaned Machine deleted after %s", time.Since(start).Round(time.Second))
	if err := WaitFor(ctx, machine.LeftoverGrace+time.Minute, func(context.Context) (bool, error) {
		return gone(leftover)
	}); err != nil {
		t.Fatalf("the leftover AWSMachine was not deleted: %v", err)
	}
	t.Logf("leftover AWSMachine deleted after %s", time.Since(start).Round(time.Second))
	if ok, err := gone(foreign); err != nil || ok {
		t.Fatalf("a Machine without the member label was deleted (gone=%v, err=%v)", ok, err)
	}
}

// logHubMachines logs the MachineDeployment's Machines and MachineSets as
// the provider sees them (MachineSet, binding, Node, phase, deletion), to
// explain a failure.
func logHubMachines(t testing.TB, mdName string) {
	t.Helper()
	ctx := context.Background()
	md := &clusterv1.MachineDeployment{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: w.Namespace, Name: mdName}, md); err == nil {
		t.Logf("MachineDeployment %s: replicas %v, annotations %v", md.Name, ptrValue(md.Spec.Replicas), md.Annotations)
	}
	sets := &clusterv1.MachineSetList{}
	if err := w.Hub.Client.List(ctx, sets, client.InNamespace(w.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: mdName}); err == nil {
		for _, s := range sets.Items {
			t.Logf("MachineSet %s: template %s, replicas %v, deleting %v", s.Name, s.Spec.Template.Spec.InfrastructureRef.Name, ptrValue(s.Spec.Replicas), !s.DeletionTimestamp.IsZero())
		}
	}
	ms := &clusterv1.MachineList{}
	if err := w.Hub.Client.List(ctx, ms, client.InNamespace(w.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: mdName}); err != nil {
		t.Logf("listing Machines: %v", err)
		return
	}
	for _, m := range ms.Items {
		t.Logf("Machine %s: set %s, phase %s, node %q, deleting %v, annotations %v, created %s",
			m.Name, m.Labels[clusterv1.MachineSetNameLabel], m.Status.Phase, m.Status.NodeRef.Name, !m.DeletionTimestamp.IsZero(), m.Annotations, m.CreationTimestamp.Format("15:04:05"))
	}
}

func ptrValue[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
