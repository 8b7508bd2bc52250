package cloudprovider

import (
	"context"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// machineDeploymentDrifted reports drift in MachineDeployment mode: the
// Machine belongs to a MachineSet whose template is not its
// MachineDeployment's current one, or the MachineDeployment stopped being
// eligible for the NodeClass. Karpenter then replaces the node within the
// NodePool's disruption budgets: the replacement is a new replica, which
// Cluster API creates from the current template, and the drifted Machine
// is marked and its replica given back (see docs/concepts.md, Drift).
func (c *CloudProvider) machineDeploymentDrifted(ctx context.Context, nodeClass *v1alpha1.ClusterAPINodeClass, m *clusterv1.Machine) (cloudprovider.DriftReason, error) {
	if nodeClass.Spec.ScalableResourceSelector == nil {
		return "", nil
	}
	return c.md.Drifted(ctx, nodeClass, m)
}
