package machinedeployment

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

// The records MachineDeployment mode keeps on a member MachineDeployment
// (docs/design/machinedeployment-binding.md, "The records"). Both change
// only with spec.replicas, in one write (writer.go).
const (
	// OwnedReplicasAnnotation counts the replicas of spec.replicas that are
	// Karpenter's; the rest are someone else's.
	OwnedReplicasAnnotation = v1alpha1.Group + "/owned-replicas"
	// PendingAnnotation maps the NodeClaims a replica is reserved for to the
	// raise's stamp (the API server's clock; the zero time: stamped by the
	// provider's managed-fields time, see stampOf).
	PendingAnnotation = hub.PendingNodeClaimsAnnotation
	// HeldReplicasAnnotation is an older version's record of reservations
	// whose NodeClaim went away; read once and merged into the reservations.
	HeldReplicasAnnotation = v1alpha1.Group + "/held-replicas"
)

// FieldManager is the field manager of every write MachineDeployment mode
// makes to the hub (the provider's, hub.FieldManager): the API server's
// time on its managedFields entry is the stamp of the latest raise
// (stampOf).
const FieldManager = hub.FieldManager

// records are a MachineDeployment's records as read.
type records struct {
	owned    int32
	hasOwned bool
	// pending: NodeClaim -> raise stamp; zero when not stamped yet.
	pending map[string]time.Time
	// legacy is true when records of an older version were found: the
	// next write drops them.
	legacy bool
}

// readRecords parses the records. A malformed value is an error naming the
// MachineDeployment and the annotation: the MachineDeployment is then left
// out (offerings, bindings) and reported, never guessed.
func readRecords(md *clusterv1.MachineDeployment) (records, error) {
	r := records{}
	what := func(key, raw, want string, err error) error {
		return fmt.Errorf("MachineDeployment %s/%s: annotation %q is %q, not %s: %v", md.Namespace, md.Name, key, truncate(raw), want, err)
	}
	if raw, ok := md.Annotations[OwnedReplicasAnnotation]; ok && raw != "" {
		v, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 32)
		if err != nil || v < 0 {
			if err == nil {
				err = fmt.Errorf("negative")
			}
			return r, what(OwnedReplicasAnnotation, raw, "a count of replicas", err)
		}
		r.owned, r.hasOwned = int32(v), true
	}
	pending, err := hub.PendingNodeClaims(md)
	if err != nil {
		return r, what(PendingAnnotation, md.Annotations[PendingAnnotation], "a JSON map of NodeClaim names to times", err)
	}
	r.pending = pending
	if raw, ok := md.Annotations[HeldReplicasAnnotation]; ok {
		r.legacy = true
		held := map[string]struct {
			Raised time.Time `json:"raised"`
		}{}
		if raw != "" {
			if err := json.Unmarshal([]byte(raw), &held); err != nil {
				return r, what(HeldReplicasAnnotation, raw, "a JSON map of NodeClaim names to raise times", err)
			}
		}
		for claim, h := range held {
			if _, ok := r.pending[claim]; !ok {
				r.pending[claim] = h.Raised
			}
		}
	}
	if _, ok := md.Annotations[hub.ReleasedMachinesAnnotation]; ok {
		r.legacy = true // derived now: dropped at the next write
	}
	return r, nil
}

// apply writes the records into md's annotations, dropping an older
// version's; it reports nothing, the caller compares.
func (r records) apply(md *clusterv1.MachineDeployment) {
	if md.Annotations == nil {
		md.Annotations = map[string]string{}
	}
	md.Annotations[OwnedReplicasAnnotation] = strconv.Itoa(int(max(r.owned, 0)))
	hub.SetPendingNodeClaims(md, r.pending)
	delete(md.Annotations, HeldReplicasAnnotation)
	delete(md.Annotations, hub.ReleasedMachinesAnnotation)
}

// managerTime is the API server's time of the provider's latest write to
// the object (its managedFields entry), or zero when it has none.
func managerTime(o metav1.Object) time.Time {
	for _, e := range o.GetManagedFields() {
		if e.Manager == FieldManager && e.Operation == metav1.ManagedFieldsOperationUpdate && e.Subresource == "" && e.Time != nil {
			return e.Time.Time
		}
	}
	return time.Time{}
}

// stampOf is the raise stamp of a reservation: its own, or, unstamped, the
// time of the provider's latest write to the MachineDeployment (which added
// it: every write stamps those before). ok is false when neither is known.
func stampOf(md *clusterv1.MachineDeployment, raised time.Time) (time.Time, bool) {
	if !raised.IsZero() {
		return raised, true
	}
	t := managerTime(md)
	return t, !t.IsZero()
}

// madeFor reports whether Machine m was created at or after a raise stamped
// at (both the API server's clock, whole seconds).
func madeFor(m *clusterv1.Machine, at time.Time) bool {
	return !m.CreationTimestamp.Time.Before(at.Truncate(time.Second))
}

// sizeBound reads a min-size or max-size annotation; ok is false when absent.
func sizeBound(md *clusterv1.MachineDeployment, key string) (n int32, ok bool, err error) {
	raw, ok := md.Annotations[key]
	if !ok {
		return 0, false, nil
	}
	v, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 32)
	if err != nil || v < 0 {
		return 0, false, fmt.Errorf("MachineDeployment %s/%s: annotation %q is %q, not a non-negative integer", md.Namespace, md.Name, key, raw)
	}
	return int32(v), true, nil
}

// sizeBounds reads both size annotations.
func sizeBounds(md *clusterv1.MachineDeployment) (minSize, maxSize int32, hasMax bool, err error) {
	minSize, _, minErr := sizeBound(md, instancetype.MinSizeAnnotation)
	maxSize, hasMax, maxErr := sizeBound(md, instancetype.MaxSizeAnnotation)
	if minErr != nil {
		return 0, 0, false, minErr
	}
	return minSize, maxSize, hasMax, maxErr
}

// Marks. The provider's marks name it, so that a mark someone else set (a
// person choosing a Machine to go first) is never taken for one of its own.
const (
	markPrefix = "karpenter-clusterapi"
	// legacySpareMark is an older version's mark on an unbound Machine.
	legacySpareMark = "karpenter-clusterapi: replica given back"
)

// releaseMark is the mark of a bound Machine whose NodeClaim goes.
func releaseMark(claim, why string) string {
	return fmt.Sprintf("%s: NodeClaim %s %s", markPrefix, claim, why)
}

// giveBackMark is the mark of an unbound Machine a reservation is given back with.
func giveBackMark(key string) string {
	return fmt.Sprintf("%s: replica of NodeClaim %s given back", markPrefix, key)
}

// markedByUs reports whether the Machine carries the provider's mark: its
// own value, or an older version's (a time on a bound Machine).
func markedByUs(m *clusterv1.Machine) bool {
	v, ok := m.Annotations[clusterv1.DeleteMachineAnnotation]
	if !ok {
		return false
	}
	if strings.HasPrefix(v, markPrefix) {
		return true
	}
	if m.Annotations[v1alpha1.NodeClaimAnnotation] != "" {
		_, err := time.Parse(time.RFC3339, v)
		return err == nil
	}
	return false
}

// isMarked reports whether anyone marked the Machine for deletion.
func isMarked(m *clusterv1.Machine) bool {
	_, ok := m.Annotations[clusterv1.DeleteMachineAnnotation]
	return ok
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
