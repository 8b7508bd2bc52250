package instancetype

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/capacity"
	"github.com/autonode/karpenter-clusterapi/pkg/kubelet"
)

func equalResources(a, b corev1.ResourceList) bool {
	for _, l := range []corev1.ResourceList{a, b} {
		for k := range l {
			x, y := a[k], b[k]
			if x.Cmp(y) != 0 {
				return false
			}
		}
	}
	return true
}

// kubeadmMD is a MachineDeployment bootstrapped from the KubeadmConfigTemplate "workers".
func kubeadmMD(name string, ann map[string]string) *clusterv1.MachineDeployment {
	m := md(name, ann, "us-east-1a", 0)
	m.Spec.Template.Spec.Bootstrap.ConfigRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: kubelet.KubeadmGroup, Kind: kubelet.KubeadmConfigTemplateKind, Name: "workers",
	}
	return m
}

func kubeadmTemplate(args map[string]string) *unstructured.Unstructured {
	var list []any
	for k, v := range args {
		list = append(list, map[string]any{"name": k, "value": v})
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": kubelet.KubeadmConfigTemplateKind,
		"metadata": map[string]any{"namespace": "ns", "name": "workers"},
	}}
	_ = unstructured.SetNestedField(u.Object, list, "spec", "template", "spec", "joinConfiguration", "nodeRegistration", "kubeletExtraArgs")
	return u
}

var m5large = map[string]any{"cpu": "2", "memory": "8Gi"}

// The bootstrap template's kubelet arguments decide the overhead and the pod
// limit, over the maxPods annotation.
func TestBootstrapTemplateDecidesAllocatable(t *testing.T) {
	src := FromMachineDeploymentTemplates(
		kubeadmMD("a", map[string]string{capacity.MaxPodsKey: "58"}),
		awsTemplate("m5.large", false, m5large, nil),
		kubeadmTemplate(map[string]string{
			"max-pods": "40", "kube-reserved": "cpu=200m,memory=512Mi", "system-reserved": "cpu=100m,memory=256Mi",
			"eviction-hard": "memory.available<256Mi",
		}))
	if src.Err != nil || len(src.Problems) > 0 {
		t.Fatalf("%v %v", src.Err, src.Problems)
	}
	want := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1700m"), corev1.ResourceMemory: resource.MustParse("7168Mi"), corev1.ResourcePods: resource.MustParse("40")}
	if !equalResources(src.Allocatable, want) || src.Capacity.Pods().Value() != 40 {
		t.Fatalf("allocatable %v capacity %v, want %v and 40 pods", src.Allocatable, src.Capacity, want)
	}
	// Karpenter schedules with the instance type's allocatable: the same numbers.
	set := Build([]Source{src})
	if got := set.InstanceTypes[0].Allocatable(); !equalResources(got, want) {
		t.Fatalf("instance type allocatable %v, want %v", got, want)
	}
}

func TestMaxPodsAnnotationWhenTheBootstrapDoesNotSay(t *testing.T) {
	src := FromMachineDeploymentTemplates(kubeadmMD("a", map[string]string{capacity.MaxPodsKey: "58"}), awsTemplate("m5.large", false, m5large, nil),
		kubeadmTemplate(map[string]string{"kube-reserved": "cpu=100m"}))
	if src.Capacity.Pods().Value() != 58 || src.Allocatable.Pods().Value() != 58 || src.Allocatable.Cpu().MilliValue() != 1900 {
		t.Fatalf("capacity %v allocatable %v", src.Capacity, src.Allocatable)
	}
}

// Bad values are reported naming the MachineDeployment, the template and the
// flag, and fall back to the next source; the MachineDeployment stays usable.
func TestBadBootstrapValuesFallBack(t *testing.T) {
	for _, tc := range []struct {
		args      map[string]string
		wantPods  int64
		wantCPU   int64 // allocatable millicores
		wantInMsg string
	}{
		{map[string]string{"max-pods": "lots"}, 58, 2000, "max-pods"},
		{map[string]string{"max-pods": "0", "kube-reserved": "cpu=100m"}, 58, 1900, "max-pods"},
		{map[string]string{"kube-reserved": "cpu=-100m", "max-pods": "30"}, 30, 2000, "kube-reserved"},
		{map[string]string{"system-reserved": "memory=1Gb"}, 58, 2000, "system-reserved"},
		{map[string]string{"eviction-hard": "memory.available<200%"}, 58, 2000, "eviction-hard"},
	} {
		src := FromMachineDeploymentTemplates(kubeadmMD("a", map[string]string{capacity.MaxPodsKey: "58"}), awsTemplate("m5.large", false, m5large, nil), kubeadmTemplate(tc.args))
		if src.Err != nil {
			t.Errorf("%v: the MachineDeployment must stay usable: %v", tc.args, src.Err)
			continue
		}
		msg := strings.Join(src.Problems, "; ")
		for _, want := range []string{"MachineDeployment ns/a", "KubeadmConfigTemplate ns/workers", tc.wantInMsg} {
			if !strings.Contains(msg, want) {
				t.Errorf("%v: problems %q do not say %q", tc.args, msg, want)
			}
		}
		if src.Allocatable.Pods().Value() != tc.wantPods || src.Allocatable.Cpu().MilliValue() != tc.wantCPU {
			t.Errorf("%v: allocatable %v, want %d pods and %dm cpu", tc.args, src.Allocatable, tc.wantPods, tc.wantCPU)
		}
	}
}

func TestUnreadableOrOtherBootstrap(t *testing.T) {
	src := FromMachineDeploymentTemplates(kubeadmMD("a", nil), awsTemplate("m5.large", false, m5large, nil), nil)
	if src.Err != nil || len(src.Problems) != 1 || !strings.Contains(src.Problems[0], "cannot be read") {
		t.Fatalf("%v %v", src.Err, src.Problems)
	}
	other := md("b", nil, "", 0)
	other.Spec.Template.Spec.Bootstrap.ConfigRef = clusterv1.ContractVersionedObjectReference{APIGroup: "bootstrap.cluster.x-k8s.io", Kind: "TalosConfigTemplate", Name: "t"}
	src = FromMachineDeploymentTemplates(other, awsTemplate("m5.large", false, m5large, nil), nil)
	if src.Err != nil || len(src.Problems) != 0 || src.Allocatable.Pods().Value() != kubelet.DefaultMaxPods {
		t.Fatalf("another bootstrap provider: defaults without complaint; got %v %v %v", src.Err, src.Problems, src.Allocatable)
	}
}

// A NodeClass's spec.kubelet wins field by field over the bootstrap's, which
// keeps the rest; the store's shared source is not modified.
func TestNodeClassKubeletWins(t *testing.T) {
	src := FromMachineDeploymentTemplates(kubeadmMD("a", nil), awsTemplate("m5.large", false, m5large, nil),
		kubeadmTemplate(map[string]string{"max-pods": "40", "kube-reserved": "cpu=200m"}))
	before := src.Capacity.DeepCopy()
	override, errs := kubelet.FromNodeClass(&v1alpha1.KubeletConfiguration{MaxPods: ptr.To[int32](20), SystemReserved: map[string]string{"cpu": "300m"}})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	got := src.WithKubelet(override)
	if got.Allocatable.Pods().Value() != 20 || got.Capacity.Pods().Value() != 20 || got.Allocatable.Cpu().MilliValue() != 1500 {
		t.Fatalf("allocatable %v", got.Allocatable)
	}
	if !equality.Semantic.DeepEqual(src.Capacity, before) || src.Allocatable.Pods().Value() != 40 {
		t.Fatalf("WithKubelet modified the shared source: %v %v", src.Capacity, src.Allocatable)
	}
}

func TestResolveKubeletPerNodeClass(t *testing.T) {
	store := NewStore()
	store.Put(FromMachineDeploymentTemplates(kubeadmMD("a", nil), awsTemplate("m5.large", false, m5large, nil), kubeadmTemplate(map[string]string{"max-pods": "40"})))
	sel := labels.Everything()
	plain := store.Resolve(sel, "all")
	override, _ := kubelet.FromNodeClass(&v1alpha1.KubeletConfiguration{MaxPods: ptr.To[int32](20)})
	with := store.ResolveKubelet(sel, override, "all")
	if plain == with || store.ResolveKubelet(sel, override, "all") != with || store.Resolve(sel, "all") != plain {
		t.Fatal("each kubelet override must get its own memoized set")
	}
	if plain.InstanceTypes[0].Capacity.Pods().Value() != 40 || with.InstanceTypes[0].Capacity.Pods().Value() != 20 {
		t.Fatalf("pods %v / %v", plain.InstanceTypes[0].Capacity.Pods(), with.InstanceTypes[0].Capacity.Pods())
	}
	src, ok := with.Source(types.NamespacedName{Namespace: "ns", Name: "a"})
	if !ok || src.Allocatable.Pods().Value() != 20 {
		t.Fatalf("Set.Source: %v %v", ok, src.Allocatable)
	}
}

// MachineDeployments of one instance type with different kubelet settings
// cannot share an instance type: Karpenter has one allocatable per type.
func TestDifferentKubeletSettingsDoNotMerge(t *testing.T) {
	a := FromMachineDeploymentTemplates(kubeadmMD("a", nil), awsTemplate("m5.large", false, m5large, nil), kubeadmTemplate(map[string]string{"kube-reserved": "cpu=100m"}))
	b := FromMachineDeploymentTemplates(kubeadmMD("b", nil), awsTemplate("m5.large", false, m5large, nil), kubeadmTemplate(map[string]string{"kube-reserved": "cpu=300m"}))
	set := Build([]Source{a, b})
	if len(set.Origins) != 1 || len(set.Problems) != 1 || !strings.Contains(set.Problems[0], "allocatable") {
		t.Fatalf("origins %v problems %v", set.Origins, set.Problems)
	}
}
