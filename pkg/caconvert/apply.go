package caconvert

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Outcome is what applying one object did.
type Outcome struct {
	Cluster string // "management" or "workload"
	Kind    string
	Name    string // "<namespace>/<name>" or "<name>"
	// Result: "created", "configured" or "unchanged".
	Result string
}

func (o Outcome) String() string {
	return fmt.Sprintf("%s cluster: %s %s %s", o.Cluster, o.Kind, o.Name, o.Result)
}

// Apply server-side applies the result (field manager FieldManager, without
// forcing: a field someone else owns is reported, not taken): the hub's
// partial objects to hub, the NodeClasses and NodePools to workload, these
// first. An
// object applied again unchanged is reported "unchanged": its
// resourceVersion stayed, or only others wrote it between the read and the
// apply (the read already had every applied value, and the converter's
// managedFields entry, which the API server renews when its apply changes
// the object, stayed). Every object is tried; the errors are joined.
func Apply(ctx context.Context, hub, workload client.Client, res Result) ([]Outcome, error) {
	var out []Outcome
	var errs []error
	do := func(c client.Client, where string, o *unstructured.Unstructured) {
		name := o.GetName()
		if o.GetNamespace() != "" {
			name = o.GetNamespace() + "/" + name
		}
		before := &unstructured.Unstructured{}
		before.SetGroupVersionKind(o.GroupVersionKind())
		rv := ""
		var mine *metav1.ManagedFieldsEntry
		if err := c.Get(ctx, client.ObjectKeyFromObject(o), before); err == nil {
			rv, mine = before.GetResourceVersion(), appliedBy(before)
		} else if client.IgnoreNotFound(err) != nil {
			errs = append(errs, fmt.Errorf("%s cluster: reading %s %s: %w", where, o.GetKind(), name, err))
			return
		}
		applied := o.DeepCopy()
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(applied), client.FieldOwner(FieldManager)); err != nil {
			errs = append(errs, fmt.Errorf("%s cluster: applying %s %s: %w", where, o.GetKind(), name, err))
			return
		}
		result := "configured"
		switch {
		case rv == "":
			result = "created"
		case applied.GetResourceVersion() == rv:
			result = "unchanged"
		case mine != nil && equality.Semantic.DeepEqual(mine, appliedBy(applied)) && sameApplied(before, o):
			result = "unchanged" // someone else wrote it between the read and the apply
		}
		out = append(out, Outcome{Cluster: where, Kind: o.GetKind(), Name: name, Result: result})
	}
	// The workload objects first: a member label written last never
	// leaves a MachineDeployment selected by no NodeClass; after a failed
	// workload write the labels wait for the next run.
	for _, o := range res.Workload {
		do(workload, "workload", o)
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("%w; the management cluster's labels were not written", errors.Join(errs...))
	}
	for _, o := range res.Hub {
		do(hub, "management", o)
	}
	return out, errors.Join(errs...)
}

// appliedBy returns the converter's server-side apply entry of o's
// managedFields, nil when it has none.
func appliedBy(o *unstructured.Unstructured) *metav1.ManagedFieldsEntry {
	for _, e := range o.GetManagedFields() {
		if e.Manager == FieldManager && e.Operation == metav1.ManagedFieldsOperationApply && e.Subresource == "" {
			return e.DeepCopy()
		}
	}
	return nil
}

// sameApplied reports whether have already holds every value of the
// applied object want: its name, namespace, labels and annotations, and all
// its other top-level fields.
func sameApplied(have, want *unstructured.Unstructured) bool {
	for k, v := range want.Object {
		if k != "metadata" && !contains(have.Object[k], v) {
			return false
		}
	}
	return have.GetName() == want.GetName() && have.GetNamespace() == want.GetNamespace() &&
		contains(toAny(have.GetLabels()), toAny(want.GetLabels())) && contains(toAny(have.GetAnnotations()), toAny(want.GetAnnotations()))
}

func toAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// contains reports whether every field of want has its value in have:
// maps key by key (have may hold more), anything else equal.
func contains(have, want any) bool {
	wm, ok := want.(map[string]any)
	if !ok {
		return equality.Semantic.DeepEqual(have, want)
	}
	hm, ok := have.(map[string]any)
	if !ok {
		return false
	}
	for k, v := range wm {
		if !contains(hm[k], v) {
			return false
		}
	}
	return true
}
