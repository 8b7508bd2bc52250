package hub_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

var hubEnv *environment.Cluster

func TestMain(m *testing.M) {
	var err error
	if hubEnv, err = environment.StartHub(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = hubEnv.Stop()
	os.Exit(code)
}

// TestManagedMachinesKnowTheInfrastructureProviderIDBeforeClusterAPICopiesIt:
// a launch returns the infrastructure machine's providerID as soon as the
// instance exists (CAPA sets AWSMachine.spec.providerID right after
// RunInstances); Cluster API copies it to the Machine only once the instance
// runs. Meanwhile Get and List must know the Machine by it (core would take
// the instance for gone: garbage collection, termination), and waiters wake.
// A Machine that is not Karpenter's is never indexed.
func TestManagedMachinesKnowTheInfrastructureProviderIDBeforeClusterAPICopiesIt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "early"
	if err := hubEnv.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, clusterv1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	h, err := hub.New(hubEnv.Config, s, hub.Scope{Namespace: ns, ClusterName: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	managed, err := h.NewManagedMachines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	woken := map[string]int{}
	managed.OnEarlyProviderID(func(claim string) { mu.Lock(); woken[claim]++; mu.Unlock() })
	go func() { _ = h.GetCache().Start(ctx) }()

	ours := newMachine(t, ns, "ours", true)
	newMachine(t, ns, "not-ours", false)
	waitFor(t, "the index to sync", func() bool { _, err := managed.Get("x"); return err == nil })

	const id = "aws:///us-east-1a/i-0123"
	if m, _ := managed.Get(id); m != nil {
		t.Fatalf("Machine %s found by a providerID nobody has yet", m.Name)
	}
	setInfraProviderID(t, ns, "ours", id)
	setInfraProviderID(t, ns, "not-ours", "aws:///us-east-1a/i-0999")
	waitFor(t, "Get to find the Machine by its AWSMachine's providerID", func() bool {
		m, err := managed.Get(id)
		return err == nil && m != nil && m.Name == ours.Name
	})
	if m, _ := managed.Get("aws:///us-east-1a/i-0999"); m != nil {
		t.Errorf("Machine %s that is not Karpenter's found by its AWSMachine's providerID", m.Name)
	}
	listed := map[string]string{}
	if err := managed.List(func(pid string, m *clusterv1.Machine) { listed[m.Name] = pid }); err != nil {
		t.Fatal(err)
	}
	if len(listed) != 1 || listed[ours.Name] != id {
		t.Errorf("List = %v, want only %s with %s", listed, ours.Name, id)
	}
	cur := &clusterv1.Machine{}
	if err := hubEnv.Client.Get(ctx, client.ObjectKeyFromObject(ours), cur); err != nil {
		t.Fatal(err)
	}
	if got := managed.ProviderIDOf(cur); got != id {
		t.Errorf("ProviderIDOf = %q, want %q", got, id)
	}
	mu.Lock()
	if woken["claim-ours"] == 0 || woken["claim-not-ours"] != 0 {
		t.Errorf("waiters woken %v, want claim-ours only", woken)
	}
	mu.Unlock()

	// Cluster API copies the providerID: still the same Machine.
	patch := client.MergeFrom(cur.DeepCopy())
	cur.Spec.ProviderID = id
	if err := hubEnv.Client.Patch(ctx, cur, patch); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the Machine's own providerID", func() bool {
		m, _ := managed.Get(id)
		return m != nil && m.Spec.ProviderID == id
	})
	// The Machine goes away: no longer found.
	if err := hubEnv.Client.Delete(ctx, cur); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the Machine to leave the index", func() bool { m, _ := managed.Get(id); return m == nil })
}

func newMachine(t *testing.T, ns, name string, member bool) *clusterv1.Machine {
	t.Helper()
	ctx := context.Background()
	am := &infrav1.AWSMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       infrav1.AWSMachineSpec{InstanceType: "m5.large"},
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(am)
	if err != nil {
		t.Fatal(err)
	}
	obj := &unstructured.Unstructured{}
	obj.SetUnstructuredContent(u)
	obj.SetAPIVersion(infrav1.GroupVersion.String())
	obj.SetKind("AWSMachine")
	if err := hubEnv.Client.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{clusterv1.ClusterNameLabel: "c1"}
	if member {
		labels[v1alpha1.KarpenterMemberLabel] = ""
	}
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels,
			Annotations: map[string]string{v1alpha1.NodeClaimAnnotation: "claim-" + name}},
		Spec: clusterv1.MachineSpec{
			ClusterName:       "c1",
			Bootstrap:         clusterv1.Bootstrap{DataSecretName: ptr.To("boot")},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "AWSMachine", Name: name},
		},
	}
	if err := hubEnv.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	return m
}

func setInfraProviderID(t *testing.T, ns, name, id string) {
	t.Helper()
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion(infrav1.GroupVersion.String())
	obj.SetKind("AWSMachine")
	if err := hubEnv.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, obj); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(obj.DeepCopy())
	if err := unstructured.SetNestedField(obj.Object, id, "spec", "providerID"); err != nil {
		t.Fatal(err)
	}
	if err := hubEnv.Client.Patch(context.Background(), obj, patch); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
