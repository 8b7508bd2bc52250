package cloudprovider

import (
	"maps"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

// toNodeClaim describes a Machine as a NodeClaim, with the labels and
// resources of what its mode launched it from. Labels and resources are
// shared with the mode's caches: callers must not modify them (core's Get
// and List callers only read). providerID is the Machine's as the index
// knows it (see hub.ManagedMachines).
func (c *CloudProvider) toNodeClaim(m *clusterv1.Machine, providerID string) *karpv1.NodeClaim {
	var src instancetype.Source
	known := false
	if mode := c.modeOf(m); mode != nil {
		src, known = mode.Describe(m)
	}
	return c.nodeClaimOf(m, providerID, src, known)
}

// nodeClaimOf describes a Machine with this providerID launched from src
// (when known).
func (c *CloudProvider) nodeClaimOf(m *clusterv1.Machine, providerID string, src instancetype.Source, known bool) *karpv1.NodeClaim {
	nc := &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:              m.Annotations[v1alpha1.NodeClaimAnnotation],
			CreationTimestamp: m.CreationTimestamp,
		},
		Status: karpv1.NodeClaimStatus{ProviderID: providerID},
	}
	if !m.DeletionTimestamp.IsZero() {
		nc.DeletionTimestamp = m.DeletionTimestamp
	}
	if !known {
		return nc
	}
	nc.Labels = src.Labels
	// The Machine's failure domain wins over what the source says: an
	// offering in no particular zone, or one Cluster API placed itself.
	if zone := m.Spec.FailureDomain; zone != "" && zone != src.Labels[corev1.LabelTopologyZone] {
		nc.Labels = maps.Clone(src.Labels)
		if nc.Labels == nil {
			nc.Labels = map[string]string{}
		}
		nc.Labels[corev1.LabelTopologyZone] = zone
	}
	nc.Status.Capacity = src.Capacity
	nc.Status.Allocatable = src.Allocatable
	nc.Status.ImageID = src.ImageID
	return nc
}

func truncate(s string) string {
	if len(s) > 1000 {
		return s[:997] + "..."
	}
	return s
}
