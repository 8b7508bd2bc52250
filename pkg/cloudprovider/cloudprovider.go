// Package cloudprovider implements Karpenter's CloudProvider for Cluster API.
// It orchestrates; the Cluster API plumbing lives in the mode packages.
package cloudprovider

import (
	"context"
	"fmt"
	"time"

	"github.com/awslabs/operatorpkg/status"
	corev1 "k8s.io/api/core/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// Name of this cloud provider, as Karpenter reports it.
const Name = "clusterapi"

// CloudProvider turns NodeClaims into Cluster API objects and back.
type CloudProvider struct{}

var _ cloudprovider.CloudProvider = (*CloudProvider)(nil)

// New returns the cloud provider.
func New() *CloudProvider {
	return &CloudProvider{}
}

var errNotYet = fmt.Errorf("not implemented yet")

func (c *CloudProvider) Create(ctx context.Context, nodeClaim *karpv1.NodeClaim) (*karpv1.NodeClaim, error) {
	return nil, errNotYet
}

func (c *CloudProvider) Delete(ctx context.Context, nodeClaim *karpv1.NodeClaim) error {
	return errNotYet
}

func (c *CloudProvider) Get(ctx context.Context, providerID string) (*karpv1.NodeClaim, error) {
	return nil, errNotYet
}

func (c *CloudProvider) List(ctx context.Context) ([]*karpv1.NodeClaim, error) {
	return nil, nil
}

func (c *CloudProvider) GetInstanceTypes(ctx context.Context, nodePool *karpv1.NodePool) ([]*cloudprovider.InstanceType, error) {
	return nil, nil
}

func (c *CloudProvider) IsDrifted(ctx context.Context, nodeClaim *karpv1.NodeClaim) (cloudprovider.DriftReason, error) {
	return "", nil
}

// Reboot is not something Cluster API offers: a Machine is replaced, not restarted.
func (c *CloudProvider) Reboot(ctx context.Context, nodeClaim *karpv1.NodeClaim, operationID string) error {
	return cloudprovider.NewNodeRebootNotImplementedError()
}

// RepairPolicies replaces nodes whose kubelet stopped reporting Ready. The
// toleration is longer than a MachineHealthCheck's usual timeout so that, when
// both watch the same Machines, Cluster API remediates first (see docs).
func (c *CloudProvider) RepairPolicies() []cloudprovider.RepairPolicy {
	return []cloudprovider.RepairPolicy{
		{ // the single default fallback of the set
			ConditionType: corev1.NodeReady, ConditionStatus: corev1.ConditionFalse,
			TolerationDuration: 30 * time.Minute, Action: cloudprovider.ReplaceNode,
		},
		{
			ConditionType: corev1.NodeReady, ConditionStatus: corev1.ConditionUnknown, ReasonRegex: ".*",
			TolerationDuration: 30 * time.Minute, Action: cloudprovider.ReplaceNode,
		},
	}
}

func (c *CloudProvider) Name() string { return Name }

func (c *CloudProvider) GetSupportedNodeClasses() []status.Object {
	return []status.Object{&v1alpha1.ClusterAPINodeClass{}}
}
