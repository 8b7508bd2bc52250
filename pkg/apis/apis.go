// Package apis registers every API type the provider reads or writes.
package apis

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// AddToScheme registers the Cluster API, CABPK (kubeadm bootstrap), CAPA and
// NodeClass types.
func AddToScheme(s *runtime.Scheme) error {
	for _, add := range []func(*runtime.Scheme) error{
		clusterv1.AddToScheme,
		bootstrapv1.AddToScheme,
		infrav1.AddToScheme,
		v1alpha1.AddToScheme,
	} {
		if err := add(s); err != nil {
			return err
		}
	}
	return nil
}

func init() {
	// Karpenter core builds its clients from client-go's global scheme.
	utilruntime.Must(AddToScheme(scheme.Scheme))
}
