package model

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func labelsEverything() labels.Selector { return labels.Everything() }

// runMachineSets plays Cluster API's MachineDeployment and MachineSet
// controllers (one MachineSet per MachineDeployment): the MachineSet's
// replicas follow the MachineDeployment's; it creates Machines up to them and
// deletes the excess in Cluster API's order (deleting, marked, without a
// Node, then by name); deleting Machines finish (finalizer removed).
func (w *world) runMachineSets() {
	ctx := context.Background()
	w.acting.Store(true)
	defer w.acting.Store(false)
	for _, name := range w.mds {
		md := w.md(name)
		ms := &clusterv1.MachineSet{}
		w.must(w.hub.API.Get(ctx, types.NamespacedName{Namespace: ns, Name: name + "-ms"}, ms))
		var mine []*clusterv1.Machine
		all := w.machines()
		for i := range all {
			if metav1.IsControlledBy(&all[i], ms) {
				mine = append(mine, &all[i])
			}
		}
		want := int(ptr.Deref(md.Spec.Replicas, 0))
		for i := len(mine); i < want && !w.stalled[name]; i++ {
			w.makeMachine(ms)
		}
		if excess := len(mine) - want; excess > 0 {
			prio := func(m *clusterv1.Machine) int {
				switch {
				case !m.DeletionTimestamp.IsZero():
					return 4
				case marked(m):
					return 3
				case !m.Status.NodeRef.IsDefined():
					return 2
				}
				return 1
			}
			sort.SliceStable(mine, func(i, j int) bool {
				if prio(mine[i]) != prio(mine[j]) {
					return prio(mine[i]) > prio(mine[j])
				}
				return mine[i].Name < mine[j].Name
			})
			for _, m := range mine[:excess] {
				if m.DeletionTimestamp.IsZero() {
					w.must(client.IgnoreNotFound(w.hub.API.Delete(ctx, m)))
				}
			}
		}
	}
	// Deleting Machines finish, with their infrastructure machines; the
	// provider's Machine watch reports each (its delete event).
	var gone []clusterv1.Machine
	for _, m := range w.machines() {
		if m.DeletionTimestamp.IsZero() {
			continue
		}
		last := *m.DeepCopy()
		if m.Status.NodeRef.IsDefined() {
			_ = w.spoke.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: m.Status.NodeRef.Name}})
		}
		m.Finalizers = nil
		w.must(client.IgnoreNotFound(w.hub.API.Update(ctx, &m)))
		_ = w.hub.API.Delete(ctx, &infrav1.AWSMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: m.Name}})
		gone = append(gone, last)
	}
	w.acting.Store(false)
	for i := range gone {
		if err := w.provider.MachineDeleted(ctx, &gone[i]); err != nil {
			w.t.Logf("machine deleted %s: %v", gone[i].Name, err)
		}
	}
	w.acting.Store(true)
}

// makeMachine is the MachineSet creating one Machine (and its
// infrastructure machine) from its template.
func (w *world) makeMachine(ms *clusterv1.MachineSet) {
	ctx := context.Background()
	w.seq++
	w.machinesMade++
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-m%d", ms.Labels[clusterv1.MachineDeploymentNameLabel], w.seq),
			Labels: map[string]string{}, Annotations: map[string]string{}, Finalizers: []string{clusterv1.MachineFinalizer},
			CreationTimestamp: metav1.NewTime(w.now), UID: types.UID(fmt.Sprintf("uid-m%d", w.seq)),
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(ms, clusterv1.GroupVersion.WithKind("MachineSet"))}},
		Spec: *ms.Spec.Template.Spec.DeepCopy(),
	}
	for k, v := range ms.Spec.Template.Labels {
		m.Labels[k] = v
	}
	m.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "AWSMachine", Name: m.Name}
	w.must(w.hub.API.Create(ctx, &infrav1.AWSMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: m.Name}}))
	w.must(w.hub.API.Create(ctx, m))
}

// overCreate is Cluster API's MachineSet making one Machine more than its
// replicas: a create that outlasted the reconcile's timeout was made by
// the API server anyway, and the next reconcile, not seeing it yet, made
// the Machine again (conformance run G, Utilization: 101 Machines for 100
// replicas). Its next reconcile removes the excess by its deletion order.
func (w *world) overCreate(md string) {
	w.acting.Store(true)
	defer w.acting.Store(false)
	ms := &clusterv1.MachineSet{}
	w.must(w.hub.API.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: md + "-ms"}, ms))
	w.makeMachine(ms)
}

// runInfrastructure plays the infrastructure provider and the kubelet: a
// Machine gets a providerID (or, on an exhausted MachineDeployment, its
// infrastructure machine fails with InsufficientInstanceCapacity), and then
// a Node.
func (w *world) runInfrastructure() {
	ctx := context.Background()
	w.acting.Store(true)
	defer w.acting.Store(false)
	for _, m := range w.machines() {
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		md := m.Labels[clusterv1.MachineDeploymentNameLabel]
		switch {
		case m.Spec.ProviderID == "" && w.exhausted[md]:
			am := &infrav1.AWSMachine{}
			if err := w.hub.API.Get(ctx, types.NamespacedName{Namespace: ns, Name: m.Name}, am); err == nil && am.Status.FailureReason == nil {
				am.Status.FailureReason = ptr.To("InsufficientInstanceCapacity")
				am.Status.FailureMessage = ptr.To("We currently do not have sufficient capacity")
				w.must(w.hub.API.Update(ctx, am))
			}
		case m.Spec.ProviderID == "":
			m.Spec.ProviderID = "aws:///zone-a/i-" + m.Name
			w.must(w.hub.API.Update(ctx, &m))
		case !m.Status.NodeRef.IsDefined():
			// The instance joins with Karpenter's unregistered taint (a
			// member MachineDeployment's bootstrap sets it); only a
			// NodeClaim's registration takes it off.
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-" + m.Name},
				Spec: corev1.NodeSpec{ProviderID: m.Spec.ProviderID, Taints: []corev1.Taint{karpv1.UnregisteredNoExecuteTaint}}}
			w.must(client.IgnoreAlreadyExists(w.spoke.Create(ctx, node)))
			m.Status.NodeRef = clusterv1.MachineNodeReference{Name: node.Name}
			w.must(w.hub.API.Update(ctx, &m))
		}
	}
}

// setReplicas is someone else changing a MachineDeployment's replicas (a
// person, GitOps, another autoscaler) by delta.
func (w *world) setReplicas(name string, delta int32) {
	w.acting.Store(true)
	defer w.acting.Store(false)
	md := w.md(name)
	md.Spec.Replicas = ptr.To(max(ptr.Deref(md.Spec.Replicas, 0)+delta, 0))
	w.must(w.hub.API.Update(context.Background(), md))
}

// setAnnotation sets (or, with "", removes) a MachineDeployment annotation.
func (w *world) setAnnotation(name, key, value string) {
	w.acting.Store(true)
	defer w.acting.Store(false)
	md := w.md(name)
	if value == "" {
		delete(md.Annotations, key)
	} else {
		md.Annotations[key] = value
	}
	w.must(w.hub.API.Update(context.Background(), md))
}

// healthCheckDelete is a MachineHealthCheck remediating a Machine.
func (w *world) healthCheckDelete(m *clusterv1.Machine) {
	w.acting.Store(true)
	defer w.acting.Store(false)
	w.must(client.IgnoreNotFound(w.hub.API.Delete(context.Background(), m)))
}

// collectGone plays the provider's machinegone controller and core's
// garbage collection: a launched NodeClaim whose Machine is gone or being
// deleted (a MachineHealthCheck, someone's scale-down) is deleted.
func (w *world) collectGone() {
	live := map[string]bool{}
	for _, m := range w.machines() {
		if claim := bound(&m); claim != "" && m.DeletionTimestamp.IsZero() {
			live[claim] = true
		}
	}
	for _, name := range w.claimNames() {
		if c := w.claims[name]; c.launched && !c.deleting && !live[name] {
			w.startDeleting(name)
		}
	}
}

// register is core registering launched NodeClaims' Nodes: the
// unregistered taint comes off and the registered label goes on.
func (w *world) register() {
	ctx := context.Background()
	w.acting.Store(true)
	defer w.acting.Store(false)
	for _, m := range w.machines() {
		c, ok := w.claims[bound(&m)]
		if !ok || !c.launched || !m.Status.NodeRef.IsDefined() {
			continue
		}
		w.registerNode(ctx, m.Status.NodeRef.Name)
	}
}

func (w *world) registerNode(ctx context.Context, name string) {
	node := &corev1.Node{}
	if err := w.spoke.Get(ctx, types.NamespacedName{Name: name}, node); err != nil {
		return
	}
	if _, done := node.Labels[karpv1.NodeRegisteredLabelKey]; done {
		return
	}
	if node.Labels == nil {
		node.Labels = map[string]string{}
	}
	node.Labels[karpv1.NodeRegisteredLabelKey] = "true"
	node.Spec.Taints = nil
	w.must(w.spoke.Update(ctx, node))
}

// setLabel sets (or removes) a MachineDeployment label.
func (w *world) setLabel(name, key string, on bool) {
	w.acting.Store(true)
	defer w.acting.Store(false)
	md := w.md(name)
	if on {
		md.Labels[key] = ""
	} else {
		delete(md.Labels, key)
	}
	w.must(w.hub.API.Update(context.Background(), md))
}

func typesNN(md string) types.NamespacedName { return types.NamespacedName{Namespace: ns, Name: md} }

func contains(s, sub string) bool { return strings.Contains(s, sub) }
