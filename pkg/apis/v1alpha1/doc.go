// Package v1alpha1 holds the ClusterAPINodeClass API: the Karpenter NodeClass
// that tells this provider which Cluster API objects a NodePool launches from.
// +kubebuilder:object:generate=true
// +groupName=karpenter.cluster.x-k8s.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group is the API group of the NodeClass. It is the group the community
// Cluster API provider uses, so its manifests keep working.
const Group = "karpenter.cluster.x-k8s.io"

var (
	// SchemeGroupVersion is the group version of these types.
	SchemeGroupVersion = schema.GroupVersion{Group: Group, Version: "v1alpha1"}
	// SchemeBuilder registers these types with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds these types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &ClusterAPINodeClass{}, &ClusterAPINodeClassList{})
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
