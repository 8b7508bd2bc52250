package kubelet

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestParseFlags(t *testing.T) {
	cfg, errs := ParseFlags("KubeadmConfigTemplate ns/w kubeletExtraArgs", map[string]string{
		FlagMaxPods:        "58",
		FlagKubeReserved:   "cpu=100m, memory=1Gi,pid=1000",
		FlagSystemReserved: "memory=500Mi",
		FlagEvictionHard:   "memory.available<200Mi,nodefs.available<10%",
	})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if cfg.Pods() != 58 {
		t.Fatalf("pods = %d", cfg.Pods())
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	total := cfg.Overhead(capacity).Total()
	if got := total.Cpu().MilliValue(); got != 100 {
		t.Fatalf("cpu overhead = %dm", got)
	}
	wantMem := resource.MustParse("1Gi")
	wantMem.Add(resource.MustParse("500Mi"))
	wantMem.Add(resource.MustParse("200Mi"))
	if total.Memory().Cmp(wantMem) != 0 {
		t.Fatalf("memory overhead = %v, want %v", total.Memory(), &wantMem)
	}
	if got := total.StorageEphemeral().Value(); got != 10*1024*1024*1024 {
		t.Fatalf("ephemeral overhead = %d, want 10%% of 100Gi", got)
	}
	if _, ok := total["pid"]; ok {
		t.Fatal("pid reservations do not reduce allocatable")
	}
}

func TestDefaultsAreTheKubeletsOwn(t *testing.T) {
	var cfg Config
	if cfg.Pods() != 110 {
		t.Fatal("default max pods")
	}
	total := cfg.Overhead(corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourceEphemeralStorage: resource.MustParse("20Gi")}).Total()
	if !total.Cpu().IsZero() || total.Memory().Cmp(resource.MustParse("100Mi")) != 0 || total.StorageEphemeral().Value() != 2*1024*1024*1024 {
		t.Fatalf("want nothing reserved, 100Mi memory and 10%% nodefs eviction, got %v", total)
	}
}

func TestMergeLayersUnsetFields(t *testing.T) {
	pods := int64(20)
	top := Config{MaxPods: &pods}
	lower, _ := ParseFlags("x", map[string]string{FlagMaxPods: "50", FlagKubeReserved: "cpu=1"})
	got := top.Merge(lower)
	if got.Pods() != 20 || got.KubeReserved.Cpu().Value() != 1 {
		t.Fatalf("merge = %+v", got)
	}
}

func TestBadValuesNameTheFlag(t *testing.T) {
	for flag, value := range map[string]string{
		FlagMaxPods:        "lots",
		FlagKubeReserved:   "cpu=-1",
		FlagSystemReserved: "gpu=1",
		FlagEvictionHard:   "memory.available>1Gi",
	} {
		_, errs := ParseFlags("NodeClass x spec.kubelet", map[string]string{flag: value})
		if len(errs) != 1 || !strings.Contains(errs[0].Error(), flag) || !strings.Contains(errs[0].Error(), value) {
			t.Errorf("%s=%s: want one error naming the flag and value, got %v", flag, value, errs)
		}
	}
	for _, v := range []string{"memory.available<150%", "memory.available<-1Mi", "memory.available<1e400", "nodefs.available<NaN%"} {
		if _, err := ParseEviction("k", v); err == nil {
			t.Errorf("%q accepted", v)
		}
	}
}
