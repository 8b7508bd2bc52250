package kubelet

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
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

// FuzzKubeletSources feeds the same hand-written value to every field of a
// KubeadmConfigTemplate's kubelet arguments and of a NodeClass's
// spec.kubelet: nothing panics, every accepted configuration yields a
// non-negative overhead and at least one pod, and each bad value is reported.
func FuzzKubeletSources(f *testing.F) {
	for _, s := range []string{"", "100m", "1Gi", "-1", "5%", "NaN%", "1e400", "cpu=1", "memory.available<1Gi", "0", "1000001", "\x00"} {
		f.Add(s, int32(10))
	}
	capacity := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourceEphemeralStorage: resource.MustParse("20Gi")}
	check := func(t *testing.T, cfg Config, what string) {
		for name, q := range cfg.Overhead(capacity).Total() {
			if q.Sign() < 0 {
				t.Fatalf("%s: negative overhead %s=%v", what, name, q)
			}
		}
		if cfg.Pods() < 1 {
			t.Fatalf("%s: pods %d", what, cfg.Pods())
		}
		_ = cfg.Key()
	}
	f.Fuzz(func(t *testing.T, v string, pods int32) {
		u := kubeadmTemplate([]any{arg(FlagMaxPods, v), arg(FlagKubeReserved, v), arg(FlagSystemReserved, "memory="+v), arg(FlagEvictionHard, "memory.available<"+v)})
		cfg, errs := FromKubeadmConfigTemplate(u)
		check(t, cfg, "template "+v)
		for _, e := range errs {
			_ = Problem(e)
		}
		nc, errs := FromNodeClass(&v1alpha1.KubeletConfiguration{
			MaxPods:        &pods,
			KubeReserved:   map[string]string{"cpu": v, v: "1"},
			SystemReserved: map[string]string{"memory": v},
			EvictionHard:   map[string]string{"memory.available": v, v: v},
		})
		check(t, nc, "nodeclass "+v)
		if (pods < 1 || pods > 1_000_000) == (nc.MaxPods != nil) {
			t.Fatalf("maxPods %d accepted=%v", pods, nc.MaxPods != nil)
		}
		for _, e := range errs {
			if e.Key == "" {
				t.Fatalf("error without a field: %v", e)
			}
		}
		check(t, nc.Merge(cfg), "merged "+v)
	})
}
