package machinedeployment

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// jsonPatchOp is one operation of a JSON patch (RFC 6902). Value is always
// written: a test for null is how the patch says "absent".
type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// pointer escapes a map key for a JSON pointer path (RFC 6901).
func pointer(key string) string {
	return strings.ReplaceAll(strings.ReplaceAll(key, "~", "~0"), "/", "~1")
}

// bindPatch returns the patch that binds a Machine as read to a NodeClaim,
// with the binding's preconditions (conditions 2 and 3 of
// docs/design/machinedeployment-binding.md) as test operations on what the
// read showed, and nothing more: the same Machine (UID), still unbound,
// unmarked and not being deleted, and the same Node, or still none. A test
// for null passes on an absent member (as the API server's JSON patch reads
// it), so absence is tested as null.
//
// A resourceVersion would be a stronger precondition than the binding needs:
// Cluster API writes a booting Machine every few seconds (conditions,
// references, the providerID), and a binding that had to match the exact
// version it was decided on lost the race through three live reads in a row
// on a loaded hub. The resourceVersion is tested only when the read showed no
// status at all: a status written since may carry a nodeRef, and the patch
// cannot test a member of a status that did not exist.
func bindPatch(m *clusterv1.Machine, claim string) (client.Patch, error) {
	var ops []jsonPatchOp
	test := func(path string, v any) { ops = append(ops, jsonPatchOp{Op: "test", Path: path, Value: v}) }
	add := func(path string, v any) { ops = append(ops, jsonPatchOp{Op: "add", Path: path, Value: v}) }
	if m.UID != "" {
		test("/metadata/uid", string(m.UID))
	}
	test("/metadata/deletionTimestamp", nil)
	if len(m.Annotations) == 0 {
		test("/metadata/annotations", nil)
		add("/metadata/annotations", map[string]string{v1alpha1.NodeClaimAnnotation: claim})
	} else {
		test("/metadata/annotations/"+pointer(v1alpha1.NodeClaimAnnotation), nil)
		test("/metadata/annotations/"+pointer(clusterv1.DeleteMachineAnnotation), nil)
		add("/metadata/annotations/"+pointer(v1alpha1.NodeClaimAnnotation), claim)
	}
	if len(m.Labels) == 0 {
		test("/metadata/labels", nil)
		add("/metadata/labels", map[string]string{v1alpha1.KarpenterMemberLabel: ""})
	} else {
		add("/metadata/labels/"+pointer(v1alpha1.KarpenterMemberLabel), "")
	}
	switch {
	case m.Status.NodeRef.IsDefined():
		test("/status/nodeRef/name", m.Status.NodeRef.Name)
	case !reflect.ValueOf(m.Status).IsZero():
		test("/status/nodeRef", nil)
	default:
		test("/metadata/resourceVersion", m.ResourceVersion)
	}
	return rawJSONPatch(ops)
}

// rawJSONPatch encodes a JSON patch.
func rawJSONPatch(ops []jsonPatchOp) (client.Patch, error) {
	data, err := json.Marshal(ops)
	if err != nil {
		return nil, err
	}
	return client.RawPatch(types.JSONPatchType, data), nil
}

// changedSinceRead reports whether a bind patch failed because the Machine
// is not as read: a conflict, or a failed test operation. The API server
// answers a JSON patch that does not apply (a failed test, a missing path)
// with 422 Invalid, a generic message and no causes; a Machine that fails
// validation gets 422 with the fields as causes, and is not retried.
func changedSinceRead(err error) bool {
	if apierrors.IsConflict(err) {
		return true
	}
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) {
		return false
	}
	d := status.Status().Details
	return d == nil || len(d.Causes) == 0
}
