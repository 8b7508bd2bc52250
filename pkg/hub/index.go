package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// Field indexes of the hub cache: every lookup the provider makes on a hot
// path is an index hit, never a list-and-scan. (Machines by providerID live
// in ManagedMachines, which Get and List read without copying.)
const (
	// IndexMachineNodeClaim indexes Machines by the NodeClaim they are bound to.
	IndexMachineNodeClaim = "metadata.annotations.nodeclaim"
	// IndexMachineDeploymentPendingClaim indexes MachineDeployments by the
	// NodeClaims a replica was raised for and that no Machine is bound to yet.
	IndexMachineDeploymentPendingClaim = "metadata.annotations.pendingNodeClaims"
	// IndexMachineDeploymentInfraTemplate indexes MachineDeployments by their
	// infrastructure template as "<apiGroup>/<kind>/<name>".
	IndexMachineDeploymentInfraTemplate = "spec.template.spec.infrastructureRef"
	// IndexMachineDeploymentBootstrapTemplate indexes MachineDeployments by
	// their bootstrap config template as "<apiGroup>/<kind>/<name>".
	IndexMachineDeploymentBootstrapTemplate = "spec.template.spec.bootstrap.configRef"
	// IndexMachineHostname indexes Machines by the names their
	// status.addresses give as Hostname or InternalDNS, in canonical form
	// (lower case, no trailing dot): the name a joining kubelet asks a
	// certificate for.
	IndexMachineHostname = "status.addresses.hostname"
)

// Annotations the provider keeps on MachineDeployments so that a replica it
// raised or lowered is accounted for exactly once, across restarts.
const (
	// PendingNodeClaimsAnnotation maps NodeClaim names to the time a replica
	// was raised for them; an entry leaves when a Machine is bound.
	PendingNodeClaimsAnnotation = v1alpha1.Group + "/pending-nodeclaims"
	// ReleasedMachinesAnnotation lists Machines marked for deletion whose
	// replica was already given back; an entry leaves when the Machine is gone.
	ReleasedMachinesAnnotation = v1alpha1.Group + "/released-machines"
)

// InfraTemplateKey is the IndexMachineDeploymentInfraTemplate (and
// IndexMachineDeploymentBootstrapTemplate) key of a template.
func InfraTemplateKey(apiGroup, kind, name string) string {
	return apiGroup + "/" + kind + "/" + name
}

// Index is one field index of the hub cache.
type Index struct {
	Object  client.Object
	Field   string
	Extract client.IndexerFunc
}

// Indexes are the hub cache's field indexes (also what a test's fake hub
// must index to answer the provider's lookups).
func Indexes() []Index {
	return []Index{
		{&clusterv1.Machine{}, IndexMachineNodeClaim, func(o client.Object) []string {
			if name := o.GetAnnotations()[v1alpha1.NodeClaimAnnotation]; name != "" {
				return []string{name}
			}
			return nil
		}},
		{&clusterv1.Machine{}, IndexMachineHostname, func(o client.Object) []string {
			var out []string
			for _, a := range o.(*clusterv1.Machine).Status.Addresses {
				// DNS names compare in canonical form: lower case, no trailing dot.
				name := strings.TrimSuffix(strings.ToLower(a.Address), ".")
				if (a.Type == clusterv1.MachineHostName || a.Type == clusterv1.MachineInternalDNS) && name != "" && !slices.Contains(out, name) {
					out = append(out, name)
				}
			}
			return out
		}},
		{&clusterv1.MachineDeployment{}, IndexMachineDeploymentPendingClaim, func(o client.Object) []string {
			pending, _ := PendingNodeClaims(o)
			out := make([]string, 0, len(pending))
			for name := range pending {
				out = append(out, name)
			}
			return out
		}},
		{&clusterv1.MachineDeployment{}, IndexMachineDeploymentInfraTemplate, func(o client.Object) []string {
			ref := o.(*clusterv1.MachineDeployment).Spec.Template.Spec.InfrastructureRef
			return []string{InfraTemplateKey(ref.APIGroup, ref.Kind, ref.Name)}
		}},
		{&clusterv1.MachineDeployment{}, IndexMachineDeploymentBootstrapTemplate, func(o client.Object) []string {
			ref := o.(*clusterv1.MachineDeployment).Spec.Template.Spec.Bootstrap.ConfigRef
			if !ref.IsDefined() {
				return nil
			}
			return []string{InfraTemplateKey(ref.APIGroup, ref.Kind, ref.Name)}
		}},
	}
}

// SetupIndexes registers the hub cache's field indexes. Call before start.
func (h *Hub) SetupIndexes(ctx context.Context) error {
	idx := h.GetFieldIndexer()
	for _, i := range Indexes() {
		if err := idx.IndexField(ctx, i.Object, i.Field, i.Extract); err != nil {
			return fmt.Errorf("indexing %T by %s: %w", i.Object, i.Field, err)
		}
	}
	return nil
}

// PendingNodeClaims parses the pending-nodeclaims annotation. A malformed
// value (edited by hand) reads as empty with an error naming the key.
func PendingNodeClaims(o client.Object) (map[string]time.Time, error) {
	raw, ok := o.GetAnnotations()[PendingNodeClaimsAnnotation]
	if !ok || raw == "" {
		return map[string]time.Time{}, nil
	}
	out := map[string]time.Time{}
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		return map[string]time.Time{}, fmt.Errorf("%s/%s: annotation %q is not a JSON map of NodeClaim names to times: %w",
			o.GetNamespace(), o.GetName(), PendingNodeClaimsAnnotation, err)
	}
	if out == nil { // "null"
		out = map[string]time.Time{}
	}
	return out, nil
}

// ReleasedMachines parses the released-machines annotation.
func ReleasedMachines(o client.Object) (map[string]bool, error) {
	raw, ok := o.GetAnnotations()[ReleasedMachinesAnnotation]
	out := map[string]bool{}
	if !ok || raw == "" {
		return out, nil
	}
	var names []string
	if err := json.Unmarshal([]byte(raw), &names); err != nil {
		return out, fmt.Errorf("%s/%s: annotation %q is not a JSON list of Machine names: %w", o.GetNamespace(), o.GetName(), ReleasedMachinesAnnotation, err)
	}
	for _, n := range names {
		out[n] = true
	}
	return out, nil
}

// SetPendingNodeClaims writes the pending-nodeclaims annotation (removed when empty).
func SetPendingNodeClaims(o client.Object, pending map[string]time.Time) {
	ann := o.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	if len(pending) == 0 {
		delete(ann, PendingNodeClaimsAnnotation)
	} else {
		data, _ := json.Marshal(pending) // map[string]time.Time always marshals
		ann[PendingNodeClaimsAnnotation] = string(data)
	}
	o.SetAnnotations(ann)
}

// SetReleasedMachines writes the released-machines annotation (removed when empty).
func SetReleasedMachines(o client.Object, released map[string]bool) {
	ann := o.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	if len(released) == 0 {
		delete(ann, ReleasedMachinesAnnotation)
	} else {
		names := make([]string, 0, len(released))
		for n := range released {
			names = append(names, n)
		}
		sort.Strings(names)
		data, _ := json.Marshal(names)
		ann[ReleasedMachinesAnnotation] = string(data)
	}
	o.SetAnnotations(ann)
}
