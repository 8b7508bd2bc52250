package v1alpha1

import (
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// Instance labels under the provider's domain: every instance type and Node
// carries those that can be derived (see docs/instance-labels.md), so that
// NodePools can select on them with In, NotIn, Gt and Lt.
const (
	LabelInstanceCPU             = Group + "/instance-cpu"              // vCPUs, integer
	LabelInstanceMemory          = Group + "/instance-memory"           // MiB, integer
	LabelInstanceGPUCount        = Group + "/instance-gpu-count"        // integer
	LabelInstanceGPUName         = Group + "/instance-gpu-name"         // e.g. t4, a100
	LabelInstanceGPUManufacturer = Group + "/instance-gpu-manufacturer" // e.g. nvidia
	LabelInstanceGPUMemory       = Group + "/instance-gpu-memory"       // MiB per GPU, integer
	LabelInstanceFamily          = Group + "/instance-family"           // m5d, dsv5, n2
	LabelInstanceSize            = Group + "/instance-size"             // 2xlarge, 4, standard-4
	LabelInstanceGeneration      = Group + "/instance-generation"       // integer
	LabelInstanceCategory        = Group + "/instance-category"         // m, d, n
	// LabelCapacityReservationID is Karpenter's reservation requirement
	// (cloudprovider.ReservationIDLabel): the capacity reservation a reserved
	// offering, and a NodeClaim launched into it, belongs to.
	LabelCapacityReservationID = Group + "/capacity-reservation-id"
	// LabelNodeClass is the label Karpenter core puts on NodeClaims and Nodes
	// naming their ClusterAPINodeClass (core's NodeClassLabelKey).
	LabelNodeClass = Group + "/clusterapinodeclass"
)

// The AWS provider's instance labels that can be derived from an instance
// type name and its capacity: instance types that come from CAPA
// (AWSMachineTemplate) carry them too, so NodePools written for Karpenter on
// AWS select the same instance types here. The AWS provider's other labels
// (network and EBS bandwidth, accelerators, encryption in transit, ...)
// cannot be derived and are not published.
const (
	AWSDomain                       = "karpenter.k8s.aws"
	LabelAWSInstanceCategory        = AWSDomain + "/instance-category"
	LabelAWSInstanceFamily          = AWSDomain + "/instance-family"
	LabelAWSInstanceGeneration      = AWSDomain + "/instance-generation"
	LabelAWSInstanceSize            = AWSDomain + "/instance-size"
	LabelAWSInstanceCPU             = AWSDomain + "/instance-cpu"
	LabelAWSInstanceMemory          = AWSDomain + "/instance-memory"
	LabelAWSInstanceHypervisor      = AWSDomain + "/instance-hypervisor"
	LabelAWSInstanceLocalNVMe       = AWSDomain + "/instance-local-nvme"
	LabelAWSInstanceGPUCount        = AWSDomain + "/instance-gpu-count"
	LabelAWSInstanceGPUName         = AWSDomain + "/instance-gpu-name"
	LabelAWSInstanceGPUManufacturer = AWSDomain + "/instance-gpu-manufacturer"
	LabelAWSInstanceGPUMemory       = AWSDomain + "/instance-gpu-memory"
)

// InstanceLabels are the provider-domain instance labels, in a fixed order.
var InstanceLabels = []string{
	LabelInstanceCPU, LabelInstanceMemory,
	LabelInstanceGPUCount, LabelInstanceGPUName, LabelInstanceGPUManufacturer, LabelInstanceGPUMemory,
	LabelInstanceFamily, LabelInstanceSize, LabelInstanceGeneration, LabelInstanceCategory,
}

// AWSInstanceLabels are the derivable AWS provider labels, in a fixed order.
var AWSInstanceLabels = []string{
	LabelAWSInstanceCategory, LabelAWSInstanceFamily, LabelAWSInstanceGeneration, LabelAWSInstanceSize,
	LabelAWSInstanceCPU, LabelAWSInstanceMemory, LabelAWSInstanceHypervisor, LabelAWSInstanceLocalNVMe,
	LabelAWSInstanceGPUCount, LabelAWSInstanceGPUName, LabelAWSInstanceGPUManufacturer, LabelAWSInstanceGPUMemory,
}

// IntegerLabels hold integers, so that Gt and Lt compare them.
var IntegerLabels = map[string]bool{
	LabelInstanceCPU: true, LabelInstanceMemory: true, LabelInstanceGPUCount: true, LabelInstanceGPUMemory: true, LabelInstanceGeneration: true,
	LabelAWSInstanceCPU: true, LabelAWSInstanceMemory: true, LabelAWSInstanceGPUCount: true, LabelAWSInstanceGPUMemory: true,
	LabelAWSInstanceGeneration: true, LabelAWSInstanceLocalNVMe: true,
}

// init registers the labels with Karpenter core, as every Karpenter provider
// does for its own: well-known labels are allowed in NodePool requirements
// and are never given an arbitrary value by core (it picks one value of a
// requirement on a label it does not know and puts it on the NodeClaim).
// Both domains are restricted like the AWS provider's: a NodePool that asks
// for a label of these domains that no instance type can carry (for example
// karpenter.k8s.aws/instance-network-bandwidth) is reported not valid by
// core, instead of silently matching nothing or everything.
func init() {
	karpv1.RestrictedLabelDomains = karpv1.RestrictedLabelDomains.Insert(Group, AWSDomain)
	karpv1.WellKnownLabels = karpv1.WellKnownLabels.Insert(InstanceLabels...)
	karpv1.WellKnownLabels = karpv1.WellKnownLabels.Insert(AWSInstanceLabels...)
	karpv1.WellKnownLabels = karpv1.WellKnownLabels.Insert(LabelCapacityReservationID, LabelNodeClass)
}
