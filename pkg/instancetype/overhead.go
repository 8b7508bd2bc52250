package instancetype

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
)

// Allocatable is capacity minus the overhead, floored at zero. The overhead
// of a Source comes from its kubelet configuration (Source.Kubelet, see
// pkg/kubelet): what the kubelet really keeps back, so that Karpenter plans
// with the allocatable the Node will report.
func Allocatable(capacity corev1.ResourceList, overhead *cloudprovider.InstanceTypeOverhead) corev1.ResourceList {
	out := capacity.DeepCopy()
	for name, q := range overhead.Total() {
		if v, ok := out[name]; ok {
			v.Sub(q)
			if v.Sign() < 0 {
				v = *resource.NewQuantity(0, v.Format)
			}
			out[name] = v
		}
	}
	return out
}
