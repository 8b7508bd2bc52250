package autonode

import (
	"context"
	"fmt"
	"maps"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// withControlPlaneKnob is the Cluster as Parse reads it: the knob and the
// settings may also sit on its control plane object, where a ClusterClass
// puts them for every Cluster of the class (spec.controlPlane.metadata) and
// a Cluster's topology for one (spec.topology.controlPlane.metadata). The
// Cluster's own labels and annotations win. The control plane is read only
// for a Cluster without the label.
func withControlPlaneKnob(c *clusterv1.Cluster, cp *metav1.PartialObjectMetadata) *clusterv1.Cluster {
	if cp == nil {
		return c
	}
	if _, ok := cp.Labels[EnabledLabel]; !ok {
		return c
	}
	out := c.DeepCopy()
	out.Labels = map[string]string{EnabledLabel: cp.Labels[EnabledLabel]}
	maps.Copy(out.Labels, c.Labels)
	out.Annotations = map[string]string{}
	for k, v := range cp.Annotations {
		if len(k) > len(annotationPrefix) && k[:len(annotationPrefix)] == annotationPrefix {
			out.Annotations[k] = v
		}
	}
	maps.Copy(out.Annotations, c.Annotations)
	return out
}

// controlPlaneMetadata reads the metadata of the Cluster's control plane
// object, or nil when it has none or it does not exist yet.
func controlPlaneMetadata(ctx context.Context, reader client.Reader, mapper meta.RESTMapper, c *clusterv1.Cluster) (*metav1.PartialObjectMetadata, error) {
	ref := c.Spec.ControlPlaneRef
	if !ref.IsDefined() || mapper == nil {
		return nil, nil
	}
	mapping, err := mapper.RESTMapping(ref.GroupKind())
	if err != nil {
		return nil, fmt.Errorf("control plane %s %s of Cluster %s/%s: %w", ref.Kind, ref.Name, c.Namespace, c.Name, err)
	}
	cp := &metav1.PartialObjectMetadata{}
	cp.SetGroupVersionKind(mapping.GroupVersionKind)
	if err := reader.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: ref.Name}, cp); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return nil, nil
		}
		return nil, fmt.Errorf("reading control plane %s %s of Cluster %s/%s: %w", ref.Kind, ref.Name, c.Namespace, c.Name, err)
	}
	return cp, nil
}
