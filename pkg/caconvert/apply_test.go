package caconvert

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/capacity"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// TestApplyIsIdempotent reads a Cluster set up for cluster-autoscaler from a
// real management cluster, applies the conversion to it and to a real
// workload cluster (whose CRDs validate the NodeClasses and NodePools), and
// applies it again: the second run changes nothing.
func TestApplyIsIdempotent(t *testing.T) {
	hubEnv, err := environment.StartHub()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hubEnv.Stop() }()
	spokeEnv, err := environment.StartSpoke()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = spokeEnv.Stop() }()
	ctx := context.Background()
	if err := hubEnv.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	for _, o := range []struct {
		name string
		ann  map[string]string
	}{
		{"c1-m5", sized("0", "4", "2", "8Gi", capacity.LabelsKey, "node.kubernetes.io/instance-type=m5.large")},
		{"c1-c5", sized("1", "2", "4", "8Gi", capacity.LabelsKey, "node.kubernetes.io/instance-type=c5.xlarge")},
		{"c1-broken", sized("0", "many", "2", "8Gi")},
		{"c1-plain", nil},
		// The migration's step 3 done: min-size removed to stop
		// cluster-autoscaler before the first --apply.
		{"c1-general", map[string]string{MaxSizeAnnotation: "4", capacity.CPUKey: "2", capacity.MemoryKey: "4Gi", capacity.TaintsKey: "general=yes:NoSchedule"}},
	} {
		md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{Namespace: ns, Name: o.name, ClusterName: "c1", Annotations: o.ann})
		if err := hubEnv.Client.Create(ctx, md); err != nil {
			t.Fatal(err)
		}
	}
	tmpl := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "AWSMachineTemplate",
		"metadata": map[string]any{"name": "c1-m5", "namespace": ns},
		"spec":     map[string]any{"template": map[string]any{"spec": map[string]any{"instanceType": "m5.large"}}},
	}}
	if err := hubEnv.Client.Create(ctx, tmpl); err != nil {
		t.Fatal(err)
	}

	in, err := Read(ctx, hubEnv.Client, ns, "c1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(in.MachineDeployments) != 5 || len(in.Templates) != 1 {
		t.Fatalf("read %d MachineDeployments and %d templates, want 5 and 1", len(in.MachineDeployments), len(in.Templates))
	}
	assume := Settings{AssumeNodeGroups: []string{"c1-general"}}
	res := Convert(in, assume)
	if f := finding(t, res, "MachineDeployment team/c1-broken", MaxSizeAnnotation); f.Kind != Skipped {
		t.Errorf("malformed max-size: %s", f)
	}
	first, err := Apply(ctx, hubEnv.Client, spokeEnv.Client, res)
	if err != nil {
		t.Fatalf("first apply: %v", err)
	}
	for _, o := range first {
		if o.Result == "unchanged" {
			t.Errorf("first apply: %s", o)
		}
	}
	if len(first) != 7 { // 3 MachineDeployments, 2 NodeClasses, 2 NodePools
		t.Errorf("first apply: %v", first)
	}
	for i, o := range first {
		if o.Cluster == "management" {
			for _, later := range first[i:] {
				if later.Cluster == "workload" {
					t.Errorf("workload object %s applied after a management label: %v", later, first)
				}
			}
			break
		}
	}
	// The second run needs no flag: the labels the first wrote say the
	// min-size was removed on purpose.
	if in, err = Read(ctx, hubEnv.Client, ns, "c1", nil); err != nil {
		t.Fatal(err)
	}
	again, err := Apply(ctx, hubEnv.Client, spokeEnv.Client, Convert(in, Settings{}))
	if err != nil {
		t.Fatalf("second apply: %v", err)
	}
	for _, o := range again {
		if o.Result != "unchanged" {
			t.Errorf("second apply changed something: %s", o)
		}
	}
	if len(again) != len(first) {
		t.Errorf("second apply: %d objects, the first %d: %v", len(again), len(first), again)
	}
	// Others write every object between the converter's read and its apply
	// (Cluster API's controllers, the provider do): still unchanged; and a
	// changed object is still told apart.
	busyHub, busySpoke := touchedAfterRead(t, hubEnv), touchedAfterRead(t, spokeEnv)
	busy, err := Apply(ctx, busyHub, busySpoke, Convert(in, Settings{}))
	if err != nil {
		t.Fatalf("apply while others write: %v", err)
	}
	for _, o := range busy {
		if o.Result != "unchanged" {
			t.Errorf("apply while others write: %s", o)
		}
	}
	changed := Convert(in, Settings{})
	ann := changed.Workload[0].GetAnnotations()
	ann["example.com/changed"] = "yes"
	changed.Workload[0].SetAnnotations(ann)
	if busy, err = Apply(ctx, busyHub, busySpoke, changed); err != nil {
		t.Fatalf("changed apply while others write: %v", err)
	}
	for i, o := range busy {
		if want := map[bool]string{true: "configured", false: "unchanged"}[i == 0]; o.Result != want {
			t.Errorf("changed apply while others write: %s, want %s", o, want)
		}
	}

	md := &clusterv1.MachineDeployment{}
	if err := hubEnv.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "c1-m5"}, md); err != nil {
		t.Fatal(err)
	}
	if _, ok := md.Labels[v1alpha1.KarpenterMemberLabel]; !ok || md.Labels[NodeClassLabel] != "c1-c5" || md.Annotations[capacity.CPUKey] != "2" {
		t.Errorf("converted MachineDeployment: labels %v annotations %v", md.Labels, md.Annotations)
	}
	np := &karpv1.NodePool{}
	if err := spokeEnv.Client.Get(ctx, client.ObjectKey{Name: "c1-c5"}, np); err != nil {
		t.Fatal(err)
	}
	nodes := np.Spec.Limits[corev1.ResourceName("nodes")]
	if nodes.String() != "6" || np.Spec.Template.Spec.NodeClassRef.Name != "c1-c5" {
		t.Errorf("NodePool: limits %v nodeClassRef %v", np.Spec.Limits, np.Spec.Template.Spec.NodeClassRef)
	}
	nc := &v1alpha1.ClusterAPINodeClass{}
	if err := spokeEnv.Client.Get(ctx, client.ObjectKey{Name: "c1-c5"}, nc); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(nc.Annotations[ConvertedFromAnnotation], "c1-m5") {
		t.Errorf("NodeClass converted-from %q", nc.Annotations[ConvertedFromAnnotation])
	}
	// A changed grouping: c1-general loses its taint and joins the pool
	// of c1-c5 and c1-m5; c1-plain-ish c1-m5 keeps its pool name. The
	// re-run deletes NodePool and NodeClass c1-general, which it wrote and
	// which its node groups no longer need; nothing else.
	gen := &clusterv1.MachineDeployment{}
	if err := hubEnv.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "c1-general"}, gen); err != nil {
		t.Fatal(err)
	}
	oldPool := gen.Labels[NodeClassLabel]
	delete(gen.Annotations, capacity.TaintsKey)
	gen.Annotations[capacity.MemoryKey] = "8Gi"
	if err := hubEnv.Client.Update(ctx, gen); err != nil {
		t.Fatal(err)
	}
	foreign := &karpv1.NodePool{ObjectMeta: metav1.ObjectMeta{Name: "someone-elses", Annotations: map[string]string{ConvertedForClusterAnnotation: ns + "/c1", ConvertedFromAnnotation: "MachineDeployment team/c1-general"}},
		Spec: np.Spec}
	if err := spokeEnv.Client.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	if in, err = Read(ctx, hubEnv.Client, ns, "c1", nil); err != nil {
		t.Fatal(err)
	}
	regrouped := Convert(in, Settings{})
	if _, err := Apply(ctx, hubEnv.Client, spokeEnv.Client, regrouped); err != nil {
		t.Fatal(err)
	}
	pruned, err := Prune(ctx, hubEnv.Client, spokeEnv.Client, regrouped, in)
	if err != nil {
		t.Fatal(err)
	}
	if len(pruned) != 2 || pruned[0].Name != oldPool || pruned[1].Name != oldPool {
		t.Errorf("regrouped: pruned %v, want NodePool and NodeClass %s", pruned, oldPool)
	}
	if err := spokeEnv.Client.Get(ctx, client.ObjectKey{Name: "someone-elses"}, &karpv1.NodePool{}); err != nil {
		t.Errorf("a NodePool the converter did not write: %v", err)
	}
	if err := spokeEnv.Client.Get(ctx, client.ObjectKey{Name: "c1-c5"}, &karpv1.NodePool{}); err != nil {
		t.Errorf("NodePool c1-c5, which keeps its name: %v", err)
	}
	// A node group that is none any more (max-size removed): its labels go.
	if err := hubEnv.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "c1-general"}, gen); err != nil {
		t.Fatal(err)
	}
	delete(gen.Annotations, MaxSizeAnnotation)
	if err := hubEnv.Client.Update(ctx, gen); err != nil {
		t.Fatal(err)
	}
	if in, err = Read(ctx, hubEnv.Client, ns, "c1", nil); err != nil {
		t.Fatal(err)
	}
	gone := Convert(in, Settings{})
	if _, err := Apply(ctx, hubEnv.Client, spokeEnv.Client, gone); err != nil {
		t.Fatal(err)
	}
	if pruned, err = Prune(ctx, hubEnv.Client, spokeEnv.Client, gone, in); err != nil || len(pruned) != 1 || pruned[0].Kind != KindMachineDeployment {
		t.Errorf("max-size removed: pruned %v, %v; want c1-general's labels", pruned, err)
	}
	if err := hubEnv.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "c1-general"}, gen); err != nil {
		t.Fatal(err)
	}
	if _, ok := gen.Labels[v1alpha1.KarpenterMemberLabel]; ok || gen.Labels[NodeClassLabel] != "" {
		t.Errorf("labels of a MachineDeployment no longer a node group: %v", gen.Labels)
	}
	t.Run("refuses another cluster than the workload one", func(t *testing.T) { checkWorkloadRefusals(t, hubEnv, spokeEnv) })
}

// checkWorkloadRefusals: --apply checks that --kubeconfig is the Cluster's workload cluster: the
// server of Cluster API's <cluster>-kubeconfig Secret, or a Node whose
// providerID is a Machine's of the Cluster. The management cluster given
// as the workload (the forgotten flag) is refused, naming both.
func checkWorkloadRefusals(t *testing.T, hubEnv, spokeEnv *environment.Cluster) {
	ctx := context.Background()
	spoke, hub := spokeEnv.Config.Host, hubEnv.Config.Host
	err := CheckWorkload(ctx, hubEnv.Client, spokeEnv.Client, spoke, ns+"/c1")
	if err == nil || !strings.Contains(err.Error(), spoke) || !strings.Contains(err.Error(), ns+"/c1") {
		t.Fatalf("no Secret, no Machines: %v, want a refusal naming both", err)
	}
	// A Node whose providerID is a Machine's of the Cluster.
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c1-m", Labels: map[string]string{clusterv1.ClusterNameLabel: "c1"}},
		Spec: clusterv1.MachineSpec{ClusterName: "c1", ProviderID: "aws:///z/i-1",
			Bootstrap:         clusterv1.Bootstrap{DataSecretName: ptrTo("x")},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "AWSMachine", Name: "c1-m"}}}
	if err := hubEnv.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := spokeEnv.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: corev1.NodeSpec{ProviderID: "aws:///z/i-1"}}); err != nil {
		t.Fatal(err)
	}
	if err := CheckWorkload(ctx, hubEnv.Client, spokeEnv.Client, spoke, ns+"/c1"); err != nil {
		t.Errorf("a Node of a Machine of the Cluster: %v", err)
	}
	if err := CheckWorkload(ctx, hubEnv.Client, hubEnv.Client, hub, ns+"/c1"); err == nil || !strings.Contains(err.Error(), hub) {
		t.Errorf("the management cluster as the workload: %v, want a refusal naming it", err)
	}
	// The Secret's server.
	kubeconfig, err := environment.KubeconfigBytes(spokeEnv.Config, "c1")
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c1-kubeconfig"},
		Data: map[string][]byte{"value": kubeconfig}}
	if err := hubEnv.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if err := CheckWorkload(ctx, hubEnv.Client, spokeEnv.Client, spoke, ns+"/c2"); err == nil {
		t.Error("another Cluster's workload accepted")
	}
	if err := hubEnv.Client.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := CheckWorkload(ctx, hubEnv.Client, spokeEnv.Client, spoke, ns+"/c1"); err != nil {
		t.Errorf("the Secret's server: %v", err)
	}
	err = CheckWorkload(ctx, hubEnv.Client, hubEnv.Client, hub, ns+"/c1")
	if err == nil || !strings.Contains(err.Error(), hub) || !strings.Contains(err.Error(), spoke) {
		t.Errorf("the management cluster as the workload, with the Secret: %v, want both servers named", err)
	}
}

// touchedAfterRead returns a client of env whose every Get is followed by
// another writer's change to the object read.
func touchedAfterRead(t *testing.T, env *environment.Cluster) client.Client {
	t.Helper()
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	return interceptor.NewClient(c, interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if err := c.Get(ctx, key, obj, opts...); err != nil {
			return err
		}
		n++
		other := &unstructured.Unstructured{}
		other.SetGroupVersionKind(obj.GetObjectKind().GroupVersionKind())
		other.SetNamespace(key.Namespace)
		other.SetName(key.Name)
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"example.com/touched":"%d"}}}`, n)
		return c.Patch(ctx, other, client.RawPatch(types.MergePatchType, []byte(patch)), client.FieldOwner("someone-else"))
	}})
}

func ptrTo[T any](v T) *T { return &v }
