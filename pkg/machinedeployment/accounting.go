package machinedeployment

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// OwnedReplicasAnnotation records, on a member MachineDeployment, how many
// of its replicas are Karpenter's: raised for a NodeClaim and not given back
// yet. It changes in the same update as spec.replicas, so the rest of the
// replicas (spec.replicas minus it) are always someone else's, whoever
// changes them concurrently.
//
// Each NodeClaim owns exactly one replica from the moment it is raised until
// it is given back. A Karpenter Machine that someone else deletes (a
// MachineHealthCheck, a RollingUpdate, a user, a concurrent scale-down that
// Cluster API served with a Karpenter Machine) leaves its replica owned but
// unused: a spare. The controller gives a spare back after OrphanGrace,
// marking an unbound Machine so the MachineSet removes that one, or
// forgets it when the replica is gone already (someone lowered the replicas).
const OwnedReplicasAnnotation = v1alpha1.Group + "/owned-replicas"

// ownedReplicas reads the annotation; ok is false when it is absent.
func ownedReplicas(o client.Object) (n int32, ok bool, err error) {
	raw, ok := o.GetAnnotations()[OwnedReplicasAnnotation]
	if !ok || raw == "" {
		return 0, false, nil
	}
	v, err := strconv.ParseInt(raw, 10, 32)
	if err != nil || v < 0 {
		return 0, false, fmt.Errorf("%s/%s: annotation %q is %q, not a count of replicas", o.GetNamespace(), o.GetName(), OwnedReplicasAnnotation, raw)
	}
	return int32(v), true, nil
}

func setOwnedReplicas(o client.Object, n int32) {
	ann := o.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[OwnedReplicasAnnotation] = strconv.Itoa(int(max(n, 0)))
	o.SetAnnotations(ann)
}

// spareMark is the value of cluster.x-k8s.io/delete-machine on an unbound
// Machine the provider marked to give a replica back with. A decision made
// on a stale read may be retried: the retry takes the Machine it marked
// before instead of marking a second one.
const spareMark = "karpenter-clusterapi: replica given back"

func spareMarked(m *clusterv1.Machine) bool {
	return m.Annotations[clusterv1.DeleteMachineAnnotation] == spareMark
}

// usage is how a MachineDeployment's Machines stand against its bookkeeping.
type usage struct {
	// bound Machines: bound to a NodeClaim, not being deleted, replica not
	// given back, NodeClaim no longer listed as pending (a pending one is
	// counted as pending). Each holds one owned replica.
	bound int32
	// live Machines: not being deleted.
	live int32
	// victims are unbound Machines, not being deleted, that a replica can
	// be given back with, best first: those this provider marked for that
	// already and the MachineSet kept, then those not marked by anyone
	// (see sortVictims).
	victims []*clusterv1.Machine
	// released are bound Machines whose replica was given back and that
	// are not being deleted yet.
	released []*clusterv1.Machine
}

// measure counts the Machines of a MachineDeployment against its pending
// and released bookkeeping. replicas is its spec.replicas; newest is the
// name of its MachineSet that matches its template ("" when unknown); skip
// leaves out Machines that are being bound.
//
// A Machine marked for a give-back is a victim again only once its
// MachineSet has settled (no more live Machines than replicas): then the
// MachineSet kept it (a raise came as it was marked) and the next give-back
// takes it. Before that, its own give-back is still being carried out: the
// MachineSet is about to remove it, and a second give-back with the same
// Machine would leave the MachineSet one more Machine to remove by its own
// order, maybe a bound one (e2e RollingUpdate drift: two spare replicas
// given back with one Machine, and the MachineSet deleted a running
// node's Machine for the second).
func measure(machines []clusterv1.Machine, pending map[string]time.Time, released map[string]bool, replicas int32, newest string, skip func(*clusterv1.Machine) bool) usage {
	var u usage
	var marked, unmarked []*clusterv1.Machine
	for i := range machines {
		m := &machines[i]
		if !m.DeletionTimestamp.IsZero() {
			continue
		}
		u.live++
		if claim := m.Annotations[v1alpha1.NodeClaimAnnotation]; claim != "" {
			if _, isPending := pending[claim]; released[m.Name] {
				u.released = append(u.released, m)
			} else if !isPending {
				u.bound++
			}
			continue
		}
		if skip(m) {
			continue
		}
		if _, ok := m.Annotations[clusterv1.DeleteMachineAnnotation]; !ok {
			unmarked = append(unmarked, m)
		} else if spareMarked(m) {
			marked = append(marked, m)
		}
	}
	if u.live > replicas {
		marked = nil
	}
	sortVictims(marked, newest)
	sortVictims(unmarked, newest)
	u.victims = append(marked, unmarked...)
	return u
}

// sortVictims orders unbound Machines by how little it costs to remove
// them: those of an outdated MachineSet first (they would be replaced
// anyway), then those without a Node yet, then the newest.
func sortVictims(ms []*clusterv1.Machine, newest string) {
	outdated := func(m *clusterv1.Machine) bool {
		return newest != "" && machineSetOf(m) != newest
	}
	sort.SliceStable(ms, func(i, j int) bool {
		a, b := ms[i], ms[j]
		if oa, ob := outdated(a), outdated(b); oa != ob {
			return oa
		}
		if na, nb := a.Status.NodeRef.IsDefined(), b.Status.NodeRef.IsDefined(); na != nb {
			return !na
		}
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return b.CreationTimestamp.Before(&a.CreationTimestamp)
		}
		return a.Name > b.Name
	})
}

// machineSetOf is the name of the MachineSet that controls the Machine.
func machineSetOf(m *clusterv1.Machine) string {
	for _, ref := range m.OwnerReferences {
		if ref.Kind == "MachineSet" && ref.Controller != nil && *ref.Controller {
			return ref.Name
		}
	}
	return ""
}

// debts remembers since when each MachineDeployment's owned replicas have
// disagreed with its NodeClaims, so that only a disagreement that outlives
// the caches' lag (OrphanGrace) is acted on.
type debts struct {
	mu    sync.Mutex
	since map[types.NamespacedName]debtSince
	// settled holds the owned count a settling op was last decided on, so
	// that a cache that does not show the op yet does not decide again.
	settled map[types.NamespacedName]debtSince
}

// settledLag bounds how long a decided owned count is held back: longer
// than the cache takes to show the write.
const settledLag = 10 * time.Second

type debtSince struct {
	positive bool
	owned    int32
	at       time.Time
}

// observe records a disagreement of the given sign and returns since when
// it has lasted; a change of sign starts over.
func (d *debts) observe(key types.NamespacedName, positive bool, now time.Time) time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.since == nil {
		d.since = map[types.NamespacedName]debtSince{}
	}
	if s, ok := d.since[key]; ok && s.positive == positive {
		return s.at
	}
	d.since[key] = debtSince{positive: positive, at: now}
	return now
}

func (d *debts) clear(key types.NamespacedName) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.since, key)
}

// decided records that a settling op was applied on the owned count.
func (d *debts) decided(key types.NamespacedName, owned int32, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.settled == nil {
		d.settled = map[types.NamespacedName]debtSince{}
	}
	d.settled[key] = debtSince{owned: owned, at: now}
}

// stale reports whether owned is the count a settling op was decided on
// lately: the cache does not show that op yet.
func (d *debts) stale(key types.NamespacedName, owned int32, now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.settled[key]
	if !ok || s.owned != owned || now.Sub(s.at) > settledLag {
		delete(d.settled, key)
		return false
	}
	return true
}

// HeldReplicasAnnotation records, on a member MachineDeployment, the owned
// replicas held for the next NodeClaim: each was raised for a NodeClaim that
// went away (Karpenter's launch timeout deleted it) before a Machine was
// bound to it. The MachineSet keeps making the Machine for it; the next
// NodeClaim reserving on the MachineDeployment takes the replica instead of
// raising another, and may be bound to that Machine. A held replica no
// reservation takes within OrphanGrace is given back. The value is a JSON
// map from the name of the NodeClaim the replica was raised for to when it
// was raised and when it was held. It changes in the same update as
// pending-nodeclaims and owned-replicas.
const HeldReplicasAnnotation = v1alpha1.Group + "/held-replicas"

// heldReplica is one entry of HeldReplicasAnnotation.
type heldReplica struct {
	// Raised is when the replica was raised: a Machine made at or after it
	// (less bindSkew) was made for it.
	Raised time.Time `json:"raised"`
	// Held is when its NodeClaim was found gone: the replica is given back
	// OrphanGrace after it.
	Held time.Time `json:"held"`
}

// heldReplicas parses the annotation. A malformed value reads as empty with
// an error naming the key.
func heldReplicas(o client.Object) (map[string]heldReplica, error) {
	raw, ok := o.GetAnnotations()[HeldReplicasAnnotation]
	out := map[string]heldReplica{}
	if !ok || raw == "" {
		return out, nil
	}
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		return map[string]heldReplica{}, fmt.Errorf("%s/%s: annotation %q is not a JSON map of NodeClaim names to raised and held times: %w",
			o.GetNamespace(), o.GetName(), HeldReplicasAnnotation, err)
	}
	if out == nil { // "null"
		out = map[string]heldReplica{}
	}
	return out, nil
}

func setHeldReplicas(o client.Object, held map[string]heldReplica) {
	ann := o.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	if len(held) == 0 {
		delete(ann, HeldReplicasAnnotation)
	} else {
		data, _ := json.Marshal(held) // strings and times always marshal
		ann[HeldReplicasAnnotation] = string(data)
	}
	o.SetAnnotations(ann)
}

// oldestHeld is the key of the held replica raised first ("" when none):
// its Machine, if made, is the oldest, and is bound first.
func oldestHeld(held map[string]heldReplica) string {
	best := ""
	for k, h := range held {
		if best == "" || h.Raised.Before(held[best].Raised) || (h.Raised.Equal(held[best].Raised) && k < best) {
			best = k
		}
	}
	return best
}
