package kubelet

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

func kubeadmTemplate(args any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": KubeadmConfigTemplateKind,
		"metadata": map[string]any{"namespace": "ns", "name": "workers"},
	}}
	if args != nil {
		_ = unstructured.SetNestedField(u.Object, args, "spec", "template", "spec", "joinConfiguration", "nodeRegistration", "kubeletExtraArgs")
	}
	return u
}

func arg(name, value string) any { return map[string]any{"name": name, "value": value} }

func TestFromKubeadmConfigTemplateV1beta2List(t *testing.T) {
	cfg, errs := FromKubeadmConfigTemplate(kubeadmTemplate([]any{
		arg("max-pods", "50"),
		arg("kube-reserved", "cpu=100m,memory=512Mi"),
		arg("node-labels", "a=b"), // not about allocatable: ignored
		arg("max-pods", "40"),     // a later duplicate wins, as in the kubelet's flag parsing
	}))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if cfg.Pods() != 40 || cfg.KubeReserved.Memory().Cmp(resource.MustParse("512Mi")) != 0 || cfg.SystemReserved != nil || cfg.EvictionHard != nil {
		t.Fatalf("cfg = %+v", cfg)
	}
}

func TestFromKubeadmConfigTemplateV1beta1Map(t *testing.T) {
	cfg, errs := FromKubeadmConfigTemplate(kubeadmTemplate(map[string]any{"max-pods": "30", "eviction-hard": "memory.available<1Gi"}))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if cfg.Pods() != 30 || cfg.EvictionHard["memory.available"] != "1Gi" {
		t.Fatalf("cfg = %+v", cfg)
	}
}

func TestFromKubeadmConfigReadsTheConfigsOwnSpec(t *testing.T) {
	u := &unstructured.Unstructured{Object: map[string]any{"kind": KubeadmConfigKind, "metadata": map[string]any{"namespace": "ns", "name": "m-1"}}}
	_ = unstructured.SetNestedField(u.Object, []any{arg("max-pods", "12")}, "spec", "joinConfiguration", "nodeRegistration", "kubeletExtraArgs")
	if cfg, errs := FromKubeadmConfig(u); len(errs) > 0 || cfg.Pods() != 12 {
		t.Fatalf("cfg %+v errs %v", cfg, errs)
	}
}

func TestFromKubeadmConfigTemplateWithoutArgs(t *testing.T) {
	for _, u := range []*unstructured.Unstructured{nil, kubeadmTemplate(nil), kubeadmTemplate([]any{})} {
		cfg, errs := FromKubeadmConfigTemplate(u)
		if len(errs) > 0 || cfg.Key() != "" {
			t.Fatalf("cfg %+v errs %v", cfg, errs)
		}
	}
}

// Every bad value is reported with the template and flag named, and only
// that setting falls back: the good ones are kept.
func TestFromKubeadmConfigTemplateBadValues(t *testing.T) {
	for _, tc := range []struct{ flag, value, reason string }{
		{FlagMaxPods, "lots", "pod count"},
		{FlagMaxPods, "0", "pod count"},
		{FlagMaxPods, "-3", "pod count"},
		{FlagMaxPods, "1e3", "pod count"},
		{FlagKubeReserved, "cpu=-100m", "negative"},
		{FlagKubeReserved, "memory=1Gb", "bad quantity"},
		{FlagKubeReserved, "memory", "resource=quantity"},
		{FlagSystemReserved, "nvidia.com/gpu=1", "only cpu"},
		{FlagSystemReserved, "cpu=1e400", "exponents"},
		{FlagEvictionHard, "memory.available<-1Mi", "negative"},
		{FlagEvictionHard, "memory.available<150%", "percentage"},
		{FlagEvictionHard, "memory.available>1Gi", "signal<threshold"},
		{FlagEvictionHard, "memory.free<1Gi", "signal"},
	} {
		cfg, errs := FromKubeadmConfigTemplate(kubeadmTemplate([]any{arg(tc.flag, tc.value), arg("system-reserved", "cpu=50m"), arg("max-pods", "20")}))
		if tc.flag == FlagSystemReserved || tc.flag == FlagMaxPods {
			cfg, errs = FromKubeadmConfigTemplate(kubeadmTemplate([]any{arg("kube-reserved", "cpu=50m"), arg(tc.flag, tc.value)}))
		}
		if len(errs) != 1 {
			t.Errorf("%s=%s: want one error, got %v", tc.flag, tc.value, errs)
			continue
		}
		msg := Problem(errs[0])
		for _, want := range []string{"KubeadmConfigTemplate ns/workers", "kubeletExtraArgs " + tc.flag, tc.value, tc.reason} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s=%s: %q does not say %q", tc.flag, tc.value, msg, want)
			}
		}
		if cfg.KubeReserved.Cpu().MilliValue() != 50 && cfg.SystemReserved.Cpu().MilliValue() != 50 {
			t.Errorf("%s=%s: the good setting was dropped too: %+v", tc.flag, tc.value, cfg)
		}
	}
}

func TestFromKubeadmConfigTemplateBadShapes(t *testing.T) {
	for name, args := range map[string]any{
		"string":        "max-pods=10",
		"item no name":  []any{map[string]any{"value": "10"}},
		"item a string": []any{"max-pods"},
		"value a map":   []any{map[string]any{"name": "max-pods", "value": map[string]any{}}},
	} {
		cfg, errs := FromKubeadmConfigTemplate(kubeadmTemplate(args))
		if len(errs) != 1 || cfg.Key() != "" || !strings.Contains(errs[0].Key, "KubeadmConfigTemplate ns/workers") {
			t.Errorf("%s: cfg %+v errs %v", name, cfg, errs)
		}
	}
}

func TestFromNodeClass(t *testing.T) {
	cfg, errs := FromNodeClass(&v1alpha1.KubeletConfiguration{
		MaxPods:        ptr.To[int32](58),
		KubeReserved:   map[string]string{"cpu": "100m", "memory": "1Gi", "pid": "1000"},
		SystemReserved: map[string]string{"memory": " 500Mi "},
		EvictionHard:   map[string]string{"memory.available": "5%", "nodefs.available": "1Gi"},
	})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	total := cfg.Overhead(corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("10Gi"), corev1.ResourceEphemeralStorage: resource.MustParse("20Gi")}).Total()
	wantMem := resource.MustParse("1524Mi")
	wantMem.Add(*resource.NewQuantity(10*1024*1024*1024/20, resource.BinarySI))
	if cfg.Pods() != 58 || total.Cpu().MilliValue() != 100 || total.Memory().Cmp(wantMem) != 0 || total.StorageEphemeral().Cmp(resource.MustParse("1Gi")) != 0 {
		t.Fatalf("pods %d overhead %v (want memory %v)", cfg.Pods(), total, &wantMem)
	}
	if cfg, errs := FromNodeClass(nil); len(errs) > 0 || cfg.Key() != "" {
		t.Fatalf("nil spec.kubelet: %+v %v", cfg, errs)
	}
}

func TestFromNodeClassBadValues(t *testing.T) {
	for _, tc := range []struct {
		name  string
		k     v1alpha1.KubeletConfiguration
		field string
	}{
		{"max pods zero", v1alpha1.KubeletConfiguration{MaxPods: ptr.To[int32](0)}, "spec.kubelet.maxPods"},
		{"max pods negative", v1alpha1.KubeletConfiguration{MaxPods: ptr.To[int32](-1)}, "spec.kubelet.maxPods"},
		{"negative reserve", v1alpha1.KubeletConfiguration{KubeReserved: map[string]string{"cpu": "-1"}}, "spec.kubelet.kubeReserved.cpu"},
		{"unparseable reserve", v1alpha1.KubeletConfiguration{SystemReserved: map[string]string{"memory": "1Gb"}}, "spec.kubelet.systemReserved.memory"},
		{"unknown reserve", v1alpha1.KubeletConfiguration{SystemReserved: map[string]string{"gpu": "1"}}, "spec.kubelet.systemReserved.gpu"},
		{"bad eviction", v1alpha1.KubeletConfiguration{EvictionHard: map[string]string{"memory.available": "101%"}}, "spec.kubelet.evictionHard.memory.available"},
		{"unparseable eviction", v1alpha1.KubeletConfiguration{EvictionHard: map[string]string{"memory.available": "lots"}}, "spec.kubelet.evictionHard.memory.available"},
		{"unknown signal", v1alpha1.KubeletConfiguration{EvictionHard: map[string]string{"memory.free": "1Gi"}}, "spec.kubelet.evictionHard.memory.free"},
	} {
		cfg, errs := FromNodeClass(&tc.k)
		if len(errs) != 1 || errs[0].Key != tc.field {
			t.Errorf("%s: want one error on %s, got %v", tc.name, tc.field, errs)
			continue
		}
		if cfg.Key() != "" {
			t.Errorf("%s: the bad field was kept: %+v", tc.name, cfg)
		}
	}
}

// The full precedence: NodeClass over bootstrap template over the maxPods
// annotation over the kubelet's defaults, field by field; a bad value falls
// through to the next source.
func TestPrecedence(t *testing.T) {
	annotationPods := int64(70)
	fromAnnotation := Config{MaxPods: &annotationPods}
	bootstrap, _ := FromKubeadmConfigTemplate(kubeadmTemplate([]any{arg("max-pods", "50"), arg("kube-reserved", "cpu=200m"), arg("system-reserved", "memory=1Gi")}))
	nodeClass, errs := FromNodeClass(&v1alpha1.KubeletConfiguration{MaxPods: ptr.To[int32](0), SystemReserved: map[string]string{"memory": "2Gi"}})
	if len(errs) != 1 {
		t.Fatalf("want the bad maxPods reported, got %v", errs)
	}
	cfg := nodeClass.Merge(bootstrap).Merge(fromAnnotation)
	if cfg.Pods() != 50 || cfg.KubeReserved.Cpu().MilliValue() != 200 || cfg.SystemReserved.Memory().Cmp(resource.MustParse("2Gi")) != 0 || cfg.EvictionHard != nil {
		t.Fatalf("cfg = %+v", cfg)
	}
	badBootstrap, _ := FromKubeadmConfigTemplate(kubeadmTemplate([]any{arg("max-pods", "many")}))
	if got := badBootstrap.Merge(fromAnnotation).Pods(); got != 70 {
		t.Fatalf("a bad bootstrap max-pods must fall back to the annotation, got %d", got)
	}
	if got := (Config{}).Merge(Config{}).Pods(); got != DefaultMaxPods {
		t.Fatalf("default pods %d", got)
	}
}

func TestKeyIdentifiesConfigurations(t *testing.T) {
	a, _ := ParseFlags("x", map[string]string{FlagMaxPods: "10", FlagKubeReserved: "memory=1Gi,cpu=1", FlagEvictionHard: "nodefs.available<5%,memory.available<1Gi"})
	b, _ := FromNodeClass(&v1alpha1.KubeletConfiguration{MaxPods: ptr.To[int32](10), KubeReserved: map[string]string{"cpu": "1", "memory": "1Gi"},
		EvictionHard: map[string]string{"memory.available": "1Gi", "nodefs.available": "5%"}})
	if a.Key() != b.Key() || a.Key() == "" {
		t.Fatalf("%q != %q", a.Key(), b.Key())
	}
	if (Config{EvictionHard: map[string]string{}}).Key() == (Config{}).Key() {
		t.Fatal("an empty eviction-hard (no thresholds) differs from an unset one (the defaults)")
	}
}
