package caconvert

import (
	"context"
	"errors"
	"fmt"

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
// object applied again unchanged is reported "unchanged" (its
// resourceVersion stayed). Every object is tried; the errors are joined.
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
		if err := c.Get(ctx, client.ObjectKeyFromObject(o), before); err == nil {
			rv = before.GetResourceVersion()
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
