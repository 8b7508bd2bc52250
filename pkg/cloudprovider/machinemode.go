package cloudprovider

import (
	"context"
	"errors"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/log"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/machine"
)

// createMachine launches a standalone Machine for the NodeClaim (Machine mode).
func (c *CloudProvider) createMachine(ctx context.Context, nodeClass *v1alpha1.ClusterAPINodeClass, nodeClaim *karpv1.NodeClaim) (*karpv1.NodeClaim, error) {
	if nodeClaim.Annotations == nil {
		nodeClaim.Annotations = map[string]string{}
	}
	var recorded *machine.Offering
	if v := nodeClaim.Annotations[v1alpha1.OfferingAnnotation]; v != "" {
		// A malformed record (edited by hand) is ignored: the launch resumes
		// from what exists in the hub, or chooses again.
		if o, err := machine.ParseOffering(v); err == nil {
			recorded = &o
		} else {
			log.FromContext(ctx).Error(err, "ignoring the recorded offering", "NodeClaim", nodeClaim.Name)
		}
	}
	record := func(o machine.Offering) {
		// Core persists this even when Create fails: a retry resumes.
		nodeClaim.Annotations[v1alpha1.OfferingAnnotation] = o.String()
	}
	choose := func(r *machine.Resolved) (instancetype.Source, error) {
		return cheapest(r.Set, c.pricedInstanceTypes(ctx, nodeClaim, r.Set), nodeClaim)
	}
	m, err := c.throughHubOutage(ctx, func() (*clusterv1.Machine, error) {
		// A retry resumes the offering the earlier attempt recorded.
		if v := nodeClaim.Annotations[v1alpha1.OfferingAnnotation]; v != "" && recorded == nil {
			if o, err := machine.ParseOffering(v); err == nil {
				recorded = &o
			}
		}
		return c.mm.Launch(ctx, nodeClass, nodeClaim.Name, recorded, record, choose)
	})
	if err != nil {
		if errors.Is(err, machine.ErrStillLaunching) {
			return nil, cloudprovider.NewCreateError(err, "MachineLaunching", truncate(err.Error()))
		}
		return nil, err
	}
	nodeClaim.Annotations[v1alpha1.MachineAnnotation] = m.Namespace + "/" + m.Name
	created := c.toNodeClaim(m).DeepCopy()
	created.Annotations = map[string]string{
		v1alpha1.MachineAnnotation:  nodeClaim.Annotations[v1alpha1.MachineAnnotation],
		v1alpha1.OfferingAnnotation: m.Annotations[v1alpha1.OfferingAnnotation],
	}
	c.launched(nodeClaim, m, created)
	return created, nil
}
