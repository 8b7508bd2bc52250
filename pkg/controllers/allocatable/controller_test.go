package allocatable

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func rl(cpu, memory, pods string) corev1.ResourceList {
	return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory), corev1.ResourcePods: resource.MustParse(pods)}
}

func TestCompare(t *testing.T) {
	promised := rl("2", "8092Mi", "110")
	if got := Compare(promised, rl("1950m", "7800Mi", "110")); len(got) != 0 {
		t.Fatalf("within 5%%: %v", got)
	}
	got := Compare(promised, rl("1500m", "8092Mi", "20"))
	if len(got) != 2 || got[0].Resource != corev1.ResourceCPU || got[1].Resource != corev1.ResourcePods || got[0].Direction() != "under" {
		t.Fatalf("got %v", got)
	}
	if s := got[0].String(); !strings.Contains(s, "cpu 1500m (planned 2, -25.0%)") {
		t.Fatalf("message %q", s)
	}
	if got := Compare(rl("1", "1Gi", "10"), rl("1", "2Gi", "10")); len(got) != 1 || got[0].Direction() != "over" {
		t.Fatalf("over: %v", got)
	}
	// Missing on the Node counts as zero; not promised is not compared.
	if got := Compare(corev1.ResourceList{corev1.ResourcePods: resource.MustParse("10")}, corev1.ResourceList{}); len(got) != 1 {
		t.Fatalf("missing: %v", got)
	}
	if got := Compare(corev1.ResourceList{}, rl("1", "1Gi", "1")); len(got) != 0 {
		t.Fatalf("nothing promised: %v", got)
	}
}
