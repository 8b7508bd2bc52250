// Package machinedeployment implements MachineDeployment mode: NodeClaims
// become replicas of labelled MachineDeployments.
package machinedeployment

import (
	"context"
	"fmt"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
)

// Select returns the MachineDeployments in scope that carry the Karpenter
// member label and match the selector, sorted by namespace and name.
func Select(ctx context.Context, r client.Reader, scope hub.Scope, selector *metav1.LabelSelector) ([]*clusterv1.MachineDeployment, error) {
	sel, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil {
		return nil, fmt.Errorf("spec.scalableResourceSelector is not a valid label selector: %w", err)
	}
	list := &clusterv1.MachineDeploymentList{}
	if err := r.List(ctx, list, scope.ListOptions(hub.HasLabel(sel, v1alpha1.KarpenterMemberLabel))...); err != nil {
		return nil, fmt.Errorf("listing MachineDeployments: %w", err)
	}
	out := make([]*clusterv1.MachineDeployment, 0, len(list.Items))
	for i := range list.Items {
		md := &list.Items[i]
		if !scope.Contains(md, md.Spec.ClusterName) {
			continue
		}
		out = append(out, md)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}
