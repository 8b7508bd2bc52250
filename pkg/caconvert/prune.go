package caconvert

import (
	"context"
	"errors"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// Prune removes what an earlier run wrote that this one does not, after
// Apply: only objects and labels the converter's field manager wrote, and
// only within this run's scope (the node groups it read), so a narrower
// --selector or another Cluster never loses anything.
//   - member and NodeClass labels on a MachineDeployment read this run that
//     is no longer a node group (server-side apply of an empty object as
//     the converter drops the labels it owned); one skipped for bad input
//     keeps them;
//   - NodeClasses and NodePools converted for this Cluster whose node groups
//     were all read this run and that the result no longer has (a changed
//     grouping).
//
// Labels go first: a NodeClass is removed only once nothing selects it.
func Prune(ctx context.Context, hub, workload client.Client, res Result, in Input) ([]Outcome, error) {
	if len(res.Clusters) != 1 {
		return nil, nil
	}
	var out []Outcome
	var errs []error
	keep := map[string]bool{}
	for _, o := range res.Hub {
		keep[o.GetKind()+" "+key(o.GetNamespace(), o.GetName())] = true
	}
	// A node group skipped for bad input this run (a typo) keeps what an
	// earlier run wrote for it.
	for _, f := range res.Findings {
		if f.Kind == Skipped {
			keep[f.Object] = true
		}
	}
	for i := range in.MachineDeployments {
		md := &in.MachineDeployments[i]
		name := KindMachineDeployment + " " + key(md.Namespace, md.Name)
		if keep[name] || md.Labels[NodeClassLabel] == "" || !ownsLabels(md.GetManagedFields()) {
			continue
		}
		empty := partial("cluster.x-k8s.io/"+clusterv1.GroupVersion.Version, KindMachineDeployment, md.Namespace, md.Name, nil, nil)
		delete(empty.Object["metadata"].(map[string]any), "labels")
		if err := hub.Apply(ctx, client.ApplyConfigurationFromUnstructured(empty), client.FieldOwner(FieldManager)); err != nil {
			errs = append(errs, fmt.Errorf("management cluster: removing the labels of %s: %w", name, err))
			continue
		}
		out = append(out, Outcome{Cluster: "management", Kind: KindMachineDeployment, Name: key(md.Namespace, md.Name), Result: "labels removed (no longer converted)"})
	}
	if len(errs) > 0 {
		return out, errors.Join(errs...)
	}
	wanted := map[string]bool{}
	for _, o := range res.Workload {
		wanted[o.GetKind()+" "+o.GetName()] = true
	}
	for _, gvk := range []schema.GroupVersionKind{
		{Group: "karpenter.sh", Version: "v1", Kind: "NodePool"},
		{Group: v1alpha1.Group, Version: "v1alpha1", Kind: "ClusterAPINodeClass"},
	} {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := workload.List(ctx, list); err != nil {
			errs = append(errs, fmt.Errorf("workload cluster: listing %ss: %w", gvk.Kind, err))
			continue
		}
		for i := range list.Items {
			o := &list.Items[i]
			if wanted[gvk.Kind+" "+o.GetName()] || !staleHere(o, res, keep) {
				continue
			}
			if err := workload.Delete(ctx, o, client.Preconditions{UID: ptrUID(o)}); client.IgnoreNotFound(err) != nil {
				errs = append(errs, fmt.Errorf("workload cluster: deleting %s %s: %w", gvk.Kind, o.GetName(), err))
				continue
			}
			out = append(out, Outcome{Cluster: "workload", Kind: gvk.Kind, Name: o.GetName(), Result: "deleted (its node groups are converted into others now)"})
		}
	}
	return out, errors.Join(errs...)
}

// staleHere: converted by this tool for this run's Cluster, from node
// groups this run read.
func staleHere(o *unstructured.Unstructured, res Result, skipped map[string]bool) bool {
	ann := o.GetAnnotations()
	if ann[ConvertedForClusterAnnotation] != res.Clusters[0] || !managedBy(o.GetManagedFields()) {
		return false
	}
	from := strings.Split(ann[ConvertedFromAnnotation], ", ")
	for _, g := range from {
		if !res.Read[g] || skipped[g] && !converted(res, g) {
			return false
		}
	}
	return len(from) > 0
}

func managedBy(fields []metav1.ManagedFieldsEntry) bool {
	for _, f := range fields {
		if f.Manager == FieldManager {
			return true
		}
	}
	return false
}

// ownsLabels: the converter's field manager owns the NodeClass label.
func ownsLabels(fields []metav1.ManagedFieldsEntry) bool {
	for _, f := range fields {
		if f.Manager == FieldManager && f.FieldsV1 != nil && strings.Contains(string(f.FieldsV1.Raw), `"f:`+NodeClassLabel+`"`) {
			return true
		}
	}
	return false
}

func ptrUID(o *unstructured.Unstructured) *types.UID {
	u := o.GetUID()
	return &u
}

// converted reports whether the node group is in this run's output.
func converted(res Result, group string) bool {
	for _, o := range res.Workload {
		for _, g := range strings.Split(o.GetAnnotations()[ConvertedFromAnnotation], ", ") {
			if g == group {
				return true
			}
		}
	}
	return false
}
