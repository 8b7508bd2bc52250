package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// machinePoolOptions shape a Machine-mode scenario's NodeClass and NodePool.
type machinePoolOptions struct {
	// CapacityTypes the NodePool allows (default on-demand).
	CapacityTypes []string
	// Budget is the NodePool's disruption budget (default 100%).
	Budget string
	// Bootstrap of the NodeClass (default the world's bootstrap data Secret).
	Bootstrap *v1alpha1.Bootstrap
}

// machinePool sets up a Machine-mode NodeClass selecting AWSMachineTemplates
// labelled pool=<name>, and its NodePool; both are removed at the end.
func machinePool(t testing.TB, name string, o machinePoolOptions) *v1alpha1.ClusterAPINodeClass {
	t.Helper()
	ctx := context.Background()
	if len(o.CapacityTypes) == 0 {
		o.CapacityTypes = []string{karpv1.CapacityTypeOnDemand}
	}
	if o.Budget == "" {
		o.Budget = "100%"
	}
	bootstrap := v1alpha1.Bootstrap{DataSecretName: &w.BootstrapSecretName}
	if o.Bootstrap != nil {
		bootstrap = *o.Bootstrap
	}
	nc := &v1alpha1.ClusterAPINodeClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.ClusterAPINodeClassSpec{
			MachineTemplate: &v1alpha1.MachineTemplate{
				InfrastructureTemplates: v1alpha1.InfrastructureTemplates{
					APIGroup: infrav1.GroupVersion.Group, Kind: "AWSMachineTemplate",
					Selector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": name}},
				},
				Bootstrap: bootstrap,
				Metadata:  v1alpha1.MachineMetadata{Labels: map[string]string{"pool": name}},
			},
		},
	}
	np := &karpv1.NodePool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: karpv1.NodePoolSpec{
			Template: karpv1.NodeClaimTemplate{
				Spec: karpv1.NodeClaimTemplateSpec{
					NodeClassRef: &karpv1.NodeClassReference{Group: v1alpha1.Group, Kind: "ClusterAPINodeClass", Name: name},
					Requirements: []karpv1.NodeSelectorRequirementWithMinValues{
						{Key: corev1.LabelOSStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"linux"}},
						{Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: o.CapacityTypes},
					},
					ExpireAfter: karpv1.MustParseNillableDuration("Never"),
				},
			},
			Disruption: karpv1.Disruption{
				ConsolidationPolicy: karpv1.ConsolidationPolicyWhenEmptyOrUnderutilized,
				ConsolidateAfter:    karpv1.MustParseNillableDuration("5s"),
				Budgets:             []karpv1.Budget{{Nodes: o.Budget}},
			},
		},
	}
	for _, obj := range []client.Object{nc, np} {
		if err := w.Spoke.Client.Create(ctx, obj); err != nil {
			t.Fatalf("creating %T %s: %v", obj, name, err)
		}
	}
	t.Cleanup(func() {
		_ = w.Spoke.Client.Delete(ctx, np)
		_ = w.Spoke.Client.Delete(ctx, nc)
	})
	return nc
}

// memberTemplate creates a Karpenter-member AWSMachineTemplate of the pool
// with the instance type's capacity in its status.
func memberTemplate(t testing.TB, pool, name, instanceType string, annotations map[string]string) *infrav1.AWSMachineTemplate {
	t.Helper()
	ctx := context.Background()
	tmpl := world.AWSMachineTemplate(w.Namespace, name, instanceType, false)
	tmpl.Labels = map[string]string{v1alpha1.KarpenterMemberLabel: "", "pool": pool, clusterv1.ClusterNameLabel: w.ClusterName}
	tmpl.Annotations = annotations
	status := tmpl.Status
	if err := w.Hub.Client.Create(ctx, tmpl); err != nil {
		t.Fatalf("creating AWSMachineTemplate %s: %v", name, err)
	}
	tmpl.Status = status
	if err := w.Hub.Client.Status().Update(ctx, tmpl); err != nil {
		t.Fatalf("writing the status of AWSMachineTemplate %s: %v", name, err)
	}
	t.Cleanup(func() { _ = w.Hub.Client.Delete(context.Background(), tmpl) })
	return tmpl
}

// poolMachines returns the Machines of a Machine-mode pool (label pool=<name>).
func poolMachines(ctx context.Context, pool string) ([]clusterv1.Machine, error) {
	list := &clusterv1.MachineList{}
	if err := w.Hub.Client.List(ctx, list, client.InNamespace(w.Namespace), client.MatchingLabels{"pool": pool}); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// poolMachinesWithIDs waits up to timeout until each of ids is the
// providerID of one of the pool's Machines, and returns the pool's Machines.
// A launch returns, and its Node may run pods, as soon as the instance has an
// ID; Cluster API copies that ID onto the Machine only once the
// infrastructure machine is provisioned (this world's kubelet does not
// register Nodes with Cluster API's uninitialized taint, which would hold
// the pods until then), so a check comparing Machines with Nodes waits for
// the copy first.
func poolMachinesWithIDs(t testing.TB, timeout time.Duration, pool string, ids ...string) []clusterv1.Machine {
	t.Helper()
	var machines []clusterv1.Machine
	var missing []string
	err := WaitFor(context.Background(), timeout, func(ctx context.Context) (bool, error) {
		var err error
		if machines, err = poolMachines(ctx, pool); err != nil {
			return false, err
		}
		have := map[string]bool{}
		for _, m := range machines {
			have[m.Spec.ProviderID] = true
		}
		missing = missing[:0]
		for _, id := range ids {
			if !have[id] {
				missing = append(missing, id)
			}
		}
		return len(missing) == 0, nil
	})
	if err != nil {
		t.Fatalf("%s: no Machine of pool %s has providerID %v after %s", err, pool, missing, timeout)
	}
	return machines
}

// managedLeftovers counts the infrastructure machines and bootstrap configs
// the provider made (managed label) that no Machine owns.
func managedLeftovers(ctx context.Context, kinds ...schema.GroupVersionKind) (int, error) {
	n := 0
	for _, gvk := range kinds {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk)
		if err := w.Hub.Client.List(ctx, list, client.InNamespace(w.Namespace), client.MatchingLabels{v1alpha1.ManagedLabel: "true"}); err != nil {
			return 0, err
		}
		for _, u := range list.Items {
			owned := false
			for _, ref := range u.GetOwnerReferences() {
				owned = owned || ref.Kind == "Machine"
			}
			if !owned {
				n++
			}
		}
	}
	return n, nil
}

var awsMachineListGVK = infrav1.GroupVersion.WithKind("AWSMachineList")
