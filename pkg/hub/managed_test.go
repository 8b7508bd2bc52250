package hub

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

func newTestIndex() *ManagedMachines {
	return &ManagedMachines{
		scope: Scope{Namespace: "ns"}, synced: func() bool { return true },
		byProvider: map[string]*clusterv1.Machine{}, byName: map[string]string{},
		waiting: map[string]*clusterv1.Machine{}, infraIDs: map[string]string{}, watched: map[schema.GroupKind]bool{},
	}
}

func testMachine(name, claim, providerID string) *clusterv1.Machine {
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name,
		Labels: map[string]string{v1alpha1.KarpenterMemberLabel: ""}, Annotations: map[string]string{}}}
	if claim != "" {
		m.Annotations[v1alpha1.NodeClaimAnnotation] = claim
	}
	m.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "AWSMachine", Name: name + "-infra"}
	m.Spec.ProviderID = providerID
	return m
}

func mustGet(t *testing.T, mm *ManagedMachines, id string) *clusterv1.Machine {
	t.Helper()
	m, err := mm.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A launch returns once the infrastructure machine has a providerID, before
// Cluster API copies it onto the Machine (after the boot): from then on
// Karpenter's Get and List must know the Machine by it, or its garbage
// collection and termination would take the booting instance for gone.
func TestAMachineIsKnownByItsInstancesProviderIDBeforeClusterAPICopiesIt(t *testing.T) {
	const id = "aws:///us-east-1a/i-0123"
	const ik = "infrastructure.cluster.x-k8s.io/AWSMachine/ns/m1-infra"
	listed := func(mm *ManagedMachines) map[string]string {
		out := map[string]string{}
		if err := mm.List(func(m *clusterv1.Machine, providerID string) { out[providerID] = m.Name }); err != nil {
			t.Fatal(err)
		}
		return out
	}

	t.Run("Machine first, then its instance", func(t *testing.T) {
		mm := newTestIndex()
		mm.upsert(testMachine("m1", "nc-1", ""))
		if m := mustGet(t, mm, id); m != nil {
			t.Fatalf("known by %s before any infrastructure machine had it", id)
		}
		mm.observeInfra(ik, id, false)
		if m := mustGet(t, mm, id); m == nil || m.Name != "m1" {
			t.Fatalf("Get(%s) = %v, want Machine m1", id, m)
		}
		if got := listed(mm); len(got) != 1 || got[id] != "m1" {
			t.Fatalf("List = %v, want m1 by %s", got, id)
		}
		// Cluster API copies it: the same entry, once.
		mm.upsert(testMachine("m1", "nc-1", id))
		if got := listed(mm); len(got) != 1 || got[id] != "m1" {
			t.Fatalf("after the copy, List = %v", got)
		}
		mm.remove(testMachine("m1", "nc-1", id))
		if got := listed(mm); len(got) != 0 {
			t.Fatalf("after the Machine's deletion, List = %v", got)
		}
	})

	t.Run("instance first, then the binding (MachineDeployment mode)", func(t *testing.T) {
		mm := newTestIndex()
		mm.upsert(testMachine("m1", "", "")) // made by the MachineSet, not bound yet
		mm.observeInfra(ik, id, false)
		if m := mustGet(t, mm, id); m != nil {
			t.Fatal("an unbound Machine is nobody's NodeClaim: it must not be listed")
		}
		mm.upsert(testMachine("m1", "nc-1", ""))
		if m := mustGet(t, mm, id); m == nil || m.Name != "m1" {
			t.Fatalf("once bound, Get(%s) = %v, want Machine m1", id, m)
		}
	})

	t.Run("not ours or out of scope", func(t *testing.T) {
		mm := newTestIndex()
		other := testMachine("m1", "nc-1", "")
		delete(other.Labels, v1alpha1.KarpenterMemberLabel)
		mm.upsert(other)
		mm.observeInfra(ik, id, false)
		if len(listed(mm)) != 0 {
			t.Fatal("a Machine without the member label was listed")
		}
		away := testMachine("m1", "nc-1", "")
		away.Namespace = "elsewhere"
		mm.upsert(away)
		if len(listed(mm)) != 0 {
			t.Fatal("a Machine out of scope was listed")
		}
	})

	t.Run("infrastructure machine gone", func(t *testing.T) {
		mm := newTestIndex()
		mm.observeInfra(ik, id, false)
		mm.observeInfra(ik, "", true)
		mm.upsert(testMachine("m1", "nc-1", ""))
		if len(listed(mm)) != 0 {
			t.Fatal("known by the providerID of an infrastructure machine that is gone")
		}
		mm.observeInfra(ik, id, false)
		if len(listed(mm)) != 1 {
			t.Fatal("not known by its instance's providerID")
		}
		mm.observeInfra(ik, "", true)
		if len(listed(mm)) != 0 {
			t.Fatal("still known by the providerID of its infrastructure machine, gone since")
		}
	})
}
