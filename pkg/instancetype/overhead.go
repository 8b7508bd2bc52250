package instancetype

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
)

// Overhead is what the kubelet keeps back from a node of this capacity when
// nothing else says so: kube-reserved as the major managed offerings compute
// it (a share of each CPU core, 11Mi per pod plus 255Mi of memory) and the
// kubelet's default hard eviction threshold of 100Mi memory. Erring high
// means a node a little larger than needed; erring low means pods that do
// not fit and an extra node, which is worse.
func Overhead(capacity corev1.ResourceList) *cloudprovider.InstanceTypeOverhead {
	pods := capacity.Pods().Value()
	if pods <= 0 {
		pods = DefaultMaxPods
	}
	return &cloudprovider.InstanceTypeOverhead{
		KubeReserved: corev1.ResourceList{
			corev1.ResourceCPU:    *resource.NewMilliQuantity(reservedCPUMillis(capacity.Cpu().MilliValue()), resource.DecimalSI),
			corev1.ResourceMemory: *resource.NewQuantity((11*pods+255)*1024*1024, resource.BinarySI),
		},
		SystemReserved: corev1.ResourceList{},
		EvictionThreshold: corev1.ResourceList{
			corev1.ResourceMemory: resource.MustParse("100Mi"),
		},
	}
}

// reservedCPUMillis: 6% of the first core, 1% of the second, 0.5% of the
// third and fourth, 0.25% of every further core.
func reservedCPUMillis(cpuMillis int64) int64 {
	var reserved float64
	steps := []struct {
		upTo  int64
		share float64
	}{{1000, 0.06}, {2000, 0.01}, {4000, 0.005}, {1 << 62, 0.0025}}
	var from int64
	for _, s := range steps {
		if cpuMillis <= from {
			break
		}
		to := min(cpuMillis, s.upTo)
		reserved += float64(to-from) * s.share
		from = s.upTo
	}
	return int64(reserved + 0.5)
}

// Allocatable is capacity minus the overhead, floored at zero.
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
