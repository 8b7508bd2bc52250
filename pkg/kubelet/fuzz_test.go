package kubelet

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func FuzzParseFlags(f *testing.F) {
	for _, s := range []string{"", "cpu=100m,memory=1Gi", "memory.available<100Mi,nodefs.available<10%", "110", "x=1e99999999", "memory.available<1e-2147483648"} {
		f.Add(s)
	}
	capacity := corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourceEphemeralStorage: resource.MustParse("20Gi")}
	f.Fuzz(func(t *testing.T, v string) {
		cfg, _ := ParseFlags("k", map[string]string{FlagMaxPods: v, FlagKubeReserved: v, FlagSystemReserved: v, FlagEvictionHard: v})
		total := cfg.Overhead(capacity).Total()
		for name, q := range total {
			if q.Sign() < 0 {
				t.Fatalf("negative overhead %s=%v from %q", name, q, v)
			}
		}
		if cfg.Pods() < 1 {
			t.Fatalf("pods %d from %q", cfg.Pods(), v)
		}
	})
}
