package model

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinedeployment/mdutil"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func labelsEverything() labels.Selector { return labels.Everything() }

// runMachineSets plays Cluster API's MachineDeployment and MachineSet
// controllers (capi_test.go). Per MachineDeployment: one pass of its
// controller (a MachineSet made for the template when none matches it, each
// MachineSet's replicas set as Cluster API does for the rollout strategy;
// with one MachineSet, the MachineDeployment's replicas); then each
// MachineSet creates Machines up to its replicas (unless creation is
// disabled or it is stalled) and deletes its excess in Cluster API's order
// (deleting, marked, without a Node, then by name). Deleting Machines
// finish (finalizer removed); the MachineSets report their status, and an
// old one with no replicas and no Machines is deleted.
func (w *world) runMachineSets() {
	ctx := context.Background()
	w.acting.Store(true)
	defer w.acting.Store(false)
	for _, name := range w.mds {
		md := w.md(name)
		w.ensureCurrentMachineSet(md)
		md = w.md(name)
		sets := capiState(md, w.machineSetsOf(md), w.mdMachines(name), metav1.NewTime(w.now))
		capiPass(md, sets)
		for _, s := range sets {
			w.applyMachineSet(md, s)
		}
		for _, s := range sets {
			if canCreate(md, s) {
				for n := s.status(); n < s.spec && !w.stalled[name]; n++ {
					w.makeMachine(s.ms)
				}
			}
			for _, m := range s.excess() {
				if !m.deleting {
					w.noteRemoval(m.m, s.name)
					w.must(client.IgnoreNotFound(w.hub.API.Delete(ctx, m.m)))
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
	w.reportMachineSets()
	w.acting.Store(false)
	for i := range gone {
		if err := w.provider.MachineDeleted(ctx, &gone[i]); err != nil {
			w.t.Logf("machine deleted %s: %v", gone[i].Name, err)
		}
	}
	w.acting.Store(true)
}

// noteRemoval records a Machine a MachineSet removes while it runs (a
// Node), unmarked, bound to a NodeClaim that is not being deleted: what
// invariant 1 exists to prevent, seen from the user's side.
func (w *world) noteRemoval(m *clusterv1.Machine, set string) {
	c, ok := w.claims[bound(m)]
	if ok && !c.deleting && !marked(m) && m.Status.NodeRef.IsDefined() {
		w.removedRunning = append(w.removedRunning, fmt.Sprintf("MachineSet %s removed Machine %s, running and bound to NodeClaim %s, which was not being deleted", set, m.Name, bound(m)))
	}
}

// newMachineSet is a MachineSet as Cluster API's MachineDeployment
// controller makes it for md's template: labelled with the cluster, the
// MachineDeployment and a template hash of its own (also in its selector
// and template), controlled by md, with its revision.
func newMachineSet(md *clusterv1.MachineDeployment, name string, created time.Time, revision string, replicas int32) *clusterv1.MachineSet {
	hash := strings.TrimPrefix(name, md.Name+"-")
	labels := mdutil.CloneAndAddLabel(md.Spec.Template.Labels, clusterv1.MachineDeploymentUniqueLabel, hash)
	labels[clusterv1.MachineDeploymentNameLabel] = md.Name
	labels[clusterv1.ClusterNameLabel] = md.Spec.ClusterName
	template := *md.Spec.Template.DeepCopy()
	template.Labels = mdutil.CloneAndAddLabel(md.Spec.Template.Labels, clusterv1.MachineDeploymentUniqueLabel, hash)
	return &clusterv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: md.Namespace, Name: name, Labels: labels,
			Annotations:       map[string]string{clusterv1.RevisionAnnotation: revision},
			CreationTimestamp: metav1.NewTime(created),
			OwnerReferences:   []metav1.OwnerReference{*metav1.NewControllerRef(md, clusterv1.GroupVersion.WithKind("MachineDeployment"))}},
		Spec: clusterv1.MachineSetSpec{ClusterName: md.Spec.ClusterName, Replicas: ptr.To(replicas),
			Selector: *mdutil.CloneSelectorAndAddLabel(&md.Spec.Selector, clusterv1.MachineDeploymentUniqueLabel, hash), Template: template},
	}
}

// ensureCurrentMachineSet is the start of Cluster API's MachineDeployment
// pass: a MachineSet for md's template (with no replicas, the newest
// creationTimestamp) when none matches it, the current one's revision above
// the old ones', and the MachineDeployment's revision annotation equal to it.
func (w *world) ensureCurrentMachineSet(md *clusterv1.MachineDeployment) {
	ctx := context.Background()
	msets := w.machineSetsOf(md)
	cur, old, _, _ := mdutil.FindNewAndOldMachineSets(md, append([]*clusterv1.MachineSet(nil), msets...), metav1.NewTime(w.now))
	anns, revision, err := mdutil.ComputeRevisionAnnotations(ctx, cur, old)
	w.must(err)
	if cur == nil {
		created := w.now.Truncate(time.Second)
		for _, ms := range msets {
			if !ms.CreationTimestamp.Time.Before(created) {
				created = ms.CreationTimestamp.Add(time.Second)
			}
		}
		w.setSeq++
		cur = newMachineSet(md, fmt.Sprintf("%s-ms%d", md.Name, w.setSeq), created, revision, 0)
		w.must(w.hub.API.Create(ctx, cur))
	} else if cur.Annotations[clusterv1.RevisionAnnotation] != revision {
		for k, v := range anns {
			cur.Annotations[k] = v
		}
		w.must(w.hub.API.Update(ctx, cur))
	}
	if md.Annotations[clusterv1.RevisionAnnotation] != revision {
		md.Annotations[clusterv1.RevisionAnnotation] = revision
		w.must(w.hub.API.Update(ctx, md))
	}
}

// applyMachineSet writes what a MachineDeployment pass decided for one
// MachineSet: its replicas, and creation disabled on old MachineSets under
// OnDelete.
func (w *world) applyMachineSet(md *clusterv1.MachineDeployment, s *capiSet) {
	ms := s.ms
	disable := "false"
	if !canCreate(md, s) {
		disable = "true"
	}
	if ptr.Deref(ms.Spec.Replicas, 0) == s.spec && ms.Annotations[clusterv1.DisableMachineCreateAnnotation] == disable {
		return
	}
	ms.Spec.Replicas = ptr.To(s.spec)
	if ms.Annotations == nil {
		ms.Annotations = map[string]string{}
	}
	ms.Annotations[clusterv1.DisableMachineCreateAnnotation] = disable
	w.must(w.hub.API.Update(context.Background(), ms))
}

// reportMachineSets is the MachineSets' status (status.replicas counts
// their Machines, deleting ones included, as Cluster API's does) and the
// deletion of old MachineSets with no replicas and no Machines.
func (w *world) reportMachineSets() {
	ctx := context.Background()
	for _, name := range w.mds {
		md := w.md(name)
		msets := w.machineSetsOf(md)
		sets := capiState(md, msets, w.mdMachines(name), metav1.NewTime(w.now))
		for _, s := range sets {
			ms := s.ms
			if ms == nil {
				continue
			}
			if s.old && s.spec == 0 && s.status() == 0 {
				w.must(client.IgnoreNotFound(w.hub.API.Delete(ctx, ms)))
				continue
			}
			if ptr.Deref(ms.Status.Replicas, -1) != s.status() || ptr.Deref(ms.Status.AvailableReplicas, -1) != s.available() {
				ms.Status.Replicas = ptr.To(s.status())
				ms.Status.AvailableReplicas = ptr.To(s.available())
				w.must(w.hub.API.Update(ctx, ms))
			}
		}
	}
}

// makeMachine is the MachineSet creating one Machine (and its
// infrastructure machine) from its template: labelled as Cluster API's
// MachineSet labels it (the template's labels, its own name, its
// MachineDeployment's), controlled by it.
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
	m.Labels[clusterv1.MachineSetNameLabel] = ms.Name
	m.Labels[clusterv1.MachineDeploymentNameLabel] = ms.Labels[clusterv1.MachineDeploymentNameLabel]
	m.Labels[clusterv1.ClusterNameLabel] = ms.Spec.ClusterName
	m.Spec.ClusterName = ms.Spec.ClusterName
	m.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "AWSMachine", Name: m.Name}
	w.must(w.hub.API.Create(ctx, &infrav1.AWSMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: m.Name}}))
	w.must(w.hub.API.Create(ctx, m))
}

// overCreate is Cluster API's MachineSet making one Machine more than its
// replicas: a create that outlasted the reconcile's timeout was made by
// the API server anyway, and the next reconcile, not seeing it yet, made
// the Machine again (conformance run G, Utilization: 101 Machines for 100
// replicas). Its next reconcile removes the excess by its deletion order.
// It is the MachineDeployment's current MachineSet (the newest while
// Cluster API has not made one for a new template yet).
func (w *world) overCreate(md string) {
	w.acting.Store(true)
	defer w.acting.Store(false)
	d := w.md(md)
	msets := w.machineSetsOf(d)
	ms := msets[len(msets)-1]
	if cur, _, _, _ := mdutil.FindNewAndOldMachineSets(d, append([]*clusterv1.MachineSet(nil), msets...), metav1.NewTime(w.now)); cur != nil {
		ms = cur
	}
	w.makeMachine(ms)
}

// rollout is someone changing a MachineDeployment's template (a new
// infrastructure template: Cluster API rolls out on it) and its rollout
// strategy: OnDelete, or RollingUpdate with maxSurge 1 and maxUnavailable 0
// (Cluster API's defaults). Cluster API makes the new MachineSet on its
// next pass.
func (w *world) rollout(name string, onDelete bool) {
	w.acting.Store(true)
	defer w.acting.Store(false)
	md := w.md(name)
	w.templateSeq++
	md.Spec.Template.Spec.InfrastructureRef.Name = fmt.Sprintf("%s-t%d", name, w.templateSeq)
	md.Spec.Rollout.Strategy = rollingUpdate()
	if onDelete {
		md.Spec.Rollout.Strategy = clusterv1.MachineDeploymentRolloutStrategy{Type: clusterv1.OnDeleteMachineDeploymentStrategyType}
	}
	w.must(w.hub.API.Update(context.Background(), md))
}

// rollingUpdate is Cluster API's default rollout strategy (its webhook's
// defaults: maxSurge 1, maxUnavailable 0).
func rollingUpdate() clusterv1.MachineDeploymentRolloutStrategy {
	return clusterv1.MachineDeploymentRolloutStrategy{Type: clusterv1.RollingUpdateMachineDeploymentStrategyType,
		RollingUpdate: clusterv1.MachineDeploymentRolloutStrategyRollingUpdate{MaxSurge: ptr.To(intstr.FromInt32(1)), MaxUnavailable: ptr.To(intstr.FromInt32(0))}}
}

// oldMachines lists the live Machines of a MachineDeployment's out-of-date
// MachineSets, by name.
func (w *world) oldMachines(name string) []clusterv1.Machine {
	md := w.md(name)
	old := map[string]bool{}
	for _, s := range capiState(md, w.machineSetsOf(md), nil, metav1.NewTime(w.now)) {
		if s.old {
			old[s.name] = true
		}
	}
	var out []clusterv1.Machine
	for _, m := range w.mdMachines(name) {
		if old[machineSetName(&m)] && m.DeletionTimestamp.IsZero() {
			out = append(out, m)
		}
	}
	return out
}

// rollByHand is a user rolling an OnDelete MachineDeployment by hand: the
// first live Machine of an old MachineSet is deleted. It returns its name,
// or "" when there is none (or the strategy is not OnDelete).
func (w *world) rollByHand(name string) string {
	if w.md(name).Spec.Rollout.Strategy.Type != clusterv1.OnDeleteMachineDeploymentStrategyType {
		return ""
	}
	old := w.oldMachines(name)
	if len(old) == 0 {
		return ""
	}
	w.healthCheckDelete(&old[0])
	return old[0].Name
}

// rolling reports whether a MachineDeployment still has an old MachineSet.
func (w *world) rolling() bool {
	for _, name := range w.mds {
		md := w.md(name)
		for _, s := range capiState(md, w.machineSetsOf(md), nil, metav1.NewTime(w.now)) {
			if s.old || s.ms == nil {
				return true
			}
		}
	}
	return false
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
