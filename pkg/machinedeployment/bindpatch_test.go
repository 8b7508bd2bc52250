package machinedeployment

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// The bind patch against a real API server with Cluster API's Machine CRD:
// Cluster API's writes to a booting Machine that the binding does not decide
// on (conditions, the providerID, labels) leave the binding standing, and
// each change it decides on (a Node, a mark, another binding, deletion, a
// Machine replaced under the same name) makes it fail as changed since the
// read. Machines as a MachineSet makes them: no status until Cluster API
// writes one, labels always, annotations sometimes none.
func TestBindPatchPreconditionsAreWhatTheBindingDecidesOn(t *testing.T) {
	ctx := context.Background()
	c := hubEnv.Client
	_ = c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bindpatch"}})
	seq := 0
	newMachine := func(t *testing.T, annotations map[string]string) *clusterv1.Machine {
		t.Helper()
		seq++
		m := &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: "bindpatch", Name: fmt.Sprintf("m-%d", seq), Annotations: annotations,
				Labels: map[string]string{clusterv1.ClusterNameLabel: "c1", clusterv1.MachineDeploymentNameLabel: "md"}},
			Spec: clusterv1.MachineSpec{ClusterName: "c1",
				Bootstrap:         clusterv1.Bootstrap{DataSecretName: ptr.To("boot")},
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "AWSMachine", Name: fmt.Sprintf("m-%d", seq)}},
		}
		if err := c.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	read := func(t *testing.T, m *clusterv1.Machine) *clusterv1.Machine {
		t.Helper()
		out := &clusterv1.Machine{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(m), out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	writeStatus := func(t *testing.T, m *clusterv1.Machine, change func(*clusterv1.Machine)) {
		t.Helper()
		live := read(t, m)
		change(live)
		if err := c.Status().Update(ctx, live); err != nil {
			t.Fatal(err)
		}
	}
	write := func(t *testing.T, m *clusterv1.Machine, change func(*clusterv1.Machine)) {
		t.Helper()
		live := read(t, m)
		change(live)
		if err := c.Update(ctx, live); err != nil {
			t.Fatal(err)
		}
	}
	bind := func(asRead *clusterv1.Machine, claim string) error {
		p, err := bindPatch(asRead, claim)
		if err != nil {
			return err
		}
		return c.Patch(ctx, asRead.DeepCopy(), p)
	}
	writes := 0
	condition := func(m *clusterv1.Machine) { // a new message each time: a write
		writes++
		meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: "InfrastructureReady", Status: metav1.ConditionFalse,
			Reason: "Provisioning", Message: fmt.Sprintf("write %d", writes)})
	}
	wantBound := func(t *testing.T, m *clusterv1.Machine, claim string) {
		t.Helper()
		live := read(t, m)
		if live.Annotations[v1alpha1.NodeClaimAnnotation] != claim {
			t.Errorf("Machine %s annotations %v: want bound to %s", m.Name, live.Annotations, claim)
		}
		if _, ok := live.Labels[v1alpha1.KarpenterMemberLabel]; !ok {
			t.Errorf("Machine %s labels %v: want the member label", m.Name, live.Labels)
		}
		if live.Labels[clusterv1.MachineDeploymentNameLabel] != "md" {
			t.Errorf("Machine %s lost its labels: %v", m.Name, live.Labels)
		}
	}
	wantChanged := func(t *testing.T, err error) {
		t.Helper()
		if err == nil {
			t.Fatal("bound a Machine that changed since the read in what the binding decides on")
		}
		if !changedSinceRead(err) {
			t.Fatalf("error %v: want it taken as changed since the read", err)
		}
	}

	// What the old resourceVersion precondition refused (a binding that
	// conflicted through three live reads in a conformance run).
	t.Run("Cluster API's writes between the read and the patch", func(t *testing.T) {
		for _, annotations := range []map[string]string{nil, {"machine.cluster.x-k8s.io/other": "x"}} {
			m := newMachine(t, annotations)
			asRead := read(t, m) // no status yet
			writeStatus(t, m, condition)
			write(t, m, func(m *clusterv1.Machine) { m.Spec.ProviderID = "aws:///us-east-1a/i-1" })
			if err := bind(asRead, "nc-a"); err == nil {
				// A Machine read before any status: its status since
				// may hold a nodeRef, so only the version would do.
				t.Errorf("bound Machine %s read before it had a status, written since", m.Name)
			} else if !changedSinceRead(err) {
				t.Fatalf("error %v: want it taken as changed since the read", err)
			}
			asRead = read(t, m) // a status, no nodeRef
			writeStatus(t, m, condition)
			write(t, m, func(m *clusterv1.Machine) { m.Labels["cluster.x-k8s.io/set-name"] = "ms" })
			if err := bind(asRead, "nc-a"); err != nil {
				t.Fatalf("binding Machine %s after writes the binding does not decide on: %v", m.Name, err)
			}
			wantBound(t, m, "nc-a")
		}
	})
	t.Run("a Machine without a status is bound as read", func(t *testing.T) {
		m := newMachine(t, nil)
		if err := bind(read(t, m), "nc-b"); err != nil {
			t.Fatal(err)
		}
		wantBound(t, m, "nc-b")
	})
	t.Run("a Node since the read", func(t *testing.T) {
		m := newMachine(t, nil)
		writeStatus(t, m, condition)
		asRead := read(t, m)
		writeStatus(t, m, func(m *clusterv1.Machine) { m.Status.NodeRef = clusterv1.MachineNodeReference{Name: "node-1"} })
		wantChanged(t, bind(asRead, "nc-c"))
		// Read with that Node (one awaiting registration, say): bound
		// while it is the same Node.
		asRead = read(t, m)
		writeStatus(t, m, condition)
		if err := bind(asRead, "nc-c"); err != nil {
			t.Fatal(err)
		}
		wantBound(t, m, "nc-c")
	})
	t.Run("another Node since the read", func(t *testing.T) {
		m := newMachine(t, nil)
		writeStatus(t, m, func(m *clusterv1.Machine) { m.Status.NodeRef = clusterv1.MachineNodeReference{Name: "node-1"} })
		asRead := read(t, m)
		writeStatus(t, m, func(m *clusterv1.Machine) { m.Status.NodeRef = clusterv1.MachineNodeReference{Name: "node-2"} })
		wantChanged(t, bind(asRead, "nc-d"))
	})
	for name, change := range map[string]func(*clusterv1.Machine){
		"a delete-machine mark since the read": func(m *clusterv1.Machine) {
			m.Annotations = map[string]string{clusterv1.DeleteMachineAnnotation: ""}
		},
		"another binding since the read": func(m *clusterv1.Machine) {
			m.Annotations = map[string]string{v1alpha1.NodeClaimAnnotation: "nc-other"}
		},
		"a deletion since the read": func(m *clusterv1.Machine) {
			m.Finalizers = []string{"test.cluster.x-k8s.io/hold"}
		},
	} {
		for _, annotations := range []map[string]string{nil, {"machine.cluster.x-k8s.io/other": "x"}} {
			t.Run(fmt.Sprintf("%s, annotations %v", name, annotations), func(t *testing.T) {
				m := newMachine(t, annotations)
				writeStatus(t, m, condition)
				asRead := read(t, m)
				write(t, m, func(live *clusterv1.Machine) {
					kept := live.Annotations
					change(live)
					for k, v := range kept {
						if live.Annotations == nil {
							live.Annotations = map[string]string{}
						}
						live.Annotations[k] = v
					}
				})
				if len(read(t, m).Finalizers) > 0 {
					if err := c.Delete(ctx, m); err != nil {
						t.Fatal(err)
					}
					defer write(t, m, func(m *clusterv1.Machine) { m.Finalizers = nil })
				}
				wantChanged(t, bind(asRead, "nc-e"))
				if live := read(t, m); live.Annotations[v1alpha1.NodeClaimAnnotation] == "nc-e" {
					t.Errorf("Machine %s bound to nc-e", m.Name)
				}
			})
		}
	}
	t.Run("a Machine replaced under the same name since the read", func(t *testing.T) {
		m := newMachine(t, nil)
		writeStatus(t, m, condition)
		asRead := read(t, m)
		if err := c.Delete(ctx, m); err != nil {
			t.Fatal(err)
		}
		again := m.DeepCopy()
		again.ResourceVersion, again.UID = "", ""
		if err := c.Create(ctx, again); err != nil {
			t.Fatal(err)
		}
		writeStatus(t, again, condition)
		wantChanged(t, bind(asRead, "nc-f"))
	})
	t.Run("a Machine that fails validation is not taken as changed", func(t *testing.T) {
		invalid := apierrors.NewInvalid(schema.GroupKind{Group: clusterv1.GroupVersion.Group, Kind: "Machine"}, "m",
			field.ErrorList{field.Invalid(field.NewPath("metadata", "labels"), "x", "bad")})
		if changedSinceRead(invalid) {
			t.Error("a validation error with causes taken as a precondition failure: it would be retried every second for ever")
		}
	})
}
