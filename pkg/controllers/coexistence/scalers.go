// Package coexistence reports other autoscalers scaling the
// MachineDeployments Karpenter scales.
//
// cluster-autoscaler's Cluster API provider and this one read the same
// min-size/max-size annotations: a MachineDeployment annotated for
// Karpenter's limits is also a node group for a cluster-autoscaler still
// running, and both would scale it. Who wrote spec.replicas is in the
// object itself: the API server records, per field manager, the fields it
// set last (metadata.managedFields). The provider writes the management
// cluster as hub.FieldManager; any other manager that owns spec.replicas
// changed it after the provider did.
//
// Two reports, both read-only (nothing is changed or undone):
//
//   - the NodeClass condition SoleScaler is False while a selected member
//     MachineDeployment's spec.replicas is owned by a manager that scales
//     as autoscalers do: through the scale subresource (cluster-autoscaler,
//     kubectl scale, a HorizontalPodAutoscaler) or named cluster-autoscaler.
//     The message names each MachineDeployment and manager (and the time
//     when the API server records one: not for scale writes). It does
//     not affect readiness; it clears when the provider next writes
//     spec.replicas itself;
//   - a Warning event ReplicasChangedByAnotherWriter on the MachineDeployment
//     each time its spec.replicas changes and the provider does not own the
//     field afterwards (any writer, scale subresource or not), when it is a
//     member or carries the autoscaler size annotations.
package coexistence

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
)

// Writer is a field manager that owns spec.replicas.
type Writer struct {
	Manager     string
	Subresource string
	Operation   metav1.ManagedFieldsOperationType
	Time        *metav1.Time
}

func (w Writer) String() string {
	s := w.Manager
	if w.Subresource != "" {
		s += " (" + w.Subresource + " subresource)"
	}
	if w.Time != nil {
		s += " at " + w.Time.UTC().Format("2006-01-02T15:04:05Z")
	}
	return s
}

// Autoscaler reports whether the writer scales the way autoscalers do.
func (w Writer) Autoscaler() bool {
	return w.Subresource == "scale" || strings.HasPrefix(w.Manager, "cluster-autoscaler")
}

// ReplicaWriters are the field managers other than the provider that own
// spec.replicas, by manager name. A managedFields entry that cannot be read
// is skipped (it says nothing about replicas).
func ReplicaWriters(obj metav1.Object) []Writer {
	var out []Writer
	for _, e := range obj.GetManagedFields() {
		if e.Manager == hub.FieldManager || e.FieldsV1 == nil || !ownsReplicas(e.FieldsV1.Raw) {
			continue
		}
		out = append(out, Writer{Manager: e.Manager, Subresource: e.Subresource, Operation: e.Operation, Time: e.Time})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Manager < out[j].Manager })
	return out
}

// ProviderOwnsReplicas reports whether the provider's field manager owns
// spec.replicas.
func ProviderOwnsReplicas(obj metav1.Object) bool {
	for _, e := range obj.GetManagedFields() {
		if e.Manager == hub.FieldManager && e.FieldsV1 != nil && ownsReplicas(e.FieldsV1.Raw) {
			return true
		}
	}
	return false
}

func ownsReplicas(raw []byte) bool {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return false
	}
	var spec map[string]json.RawMessage
	if err := json.Unmarshal(fields["f:spec"], &spec); err != nil {
		return false
	}
	_, ok := spec["f:replicas"]
	return ok
}

func describe(ws []Writer) string {
	s := make([]string, len(ws))
	for i, w := range ws {
		s[i] = w.String()
	}
	if len(s) == 0 {
		return "a writer the API server did not record"
	}
	return strings.Join(s, ", ")
}

// changeMessage is the event's message for a replica change from old to
// new by the writers.
func changeMessage(old, new int32, ws []Writer) string {
	return fmt.Sprintf("spec.replicas changed from %d to %d by %s, not by Karpenter: another autoscaler (cluster-autoscaler?) scales this MachineDeployment too; "+
		"hand it over to Karpenter or keep the two on different node groups (docs/migration-from-cluster-autoscaler.md)", old, new, describe(ws))
}
