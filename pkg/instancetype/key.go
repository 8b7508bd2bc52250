package instancetype

import (
	corev1 "k8s.io/api/core/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/scheduling"
)

// KeyOf returns the key of an offering of the named instance type, read
// from the offering's requirements: the zone and capacity type it is pinned
// to, or "" for a key it is not pinned to exactly one value of.
//
// Offering.Zone() and Offering.CapacityType() must not be used for this: they
// are Requirement.Any(), which for a requirement the offering does not set (an
// offering without a zone: a MachineDeployment without a failure domain, a
// template in a Cluster without failure domains) returns a random value,
// different at every call.
func KeyOf(instanceType string, of *cloudprovider.Offering) OfferingKey {
	return OfferingKey{
		InstanceType: instanceType,
		Zone:         Pinned(of.Requirements, corev1.LabelTopologyZone),
		CapacityType: Pinned(of.Requirements, karpv1.CapacityTypeLabelKey),
	}
}

// Pinned returns the single value requirements allow for key, or "" when
// they allow none, several, or any (key not set).
func Pinned(reqs scheduling.Requirements, key string) string {
	if !reqs.Has(key) {
		return ""
	}
	r := reqs.Get(key)
	if r.Operator() != corev1.NodeSelectorOpIn || r.Len() != 1 {
		return ""
	}
	return r.Values()[0]
}
