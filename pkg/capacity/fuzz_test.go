package capacity

import (
	"reflect"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/api/validate/content"
)

// fuzzCheckError checks the shape every error must have.
func fuzzCheckError(t *testing.T, err *FieldError, key, value string) {
	t.Helper()
	if err.Key != key || err.Value != value || err.Reason == "" {
		t.Fatalf("bad FieldError %#v for %q", err, value)
	}
	prefix := "annotation " + strconv.Quote(key) + ": " + quote(value) + " "
	if !strings.HasPrefix(err.Error(), prefix) {
		t.Fatalf("Error() = %q, want prefix %q", err.Error(), prefix)
	}
}

var quantitySeeds = []string{
	"", "0", "1", "-1", "4", "3500m", "16Gi", "1e3", "1E", "1Ei", "8Ei", "1e18", "1e19",
	"1e-2147483648", "1e4294967296", ".", "+", "e3", "NaN", "Inf", "0x10", " 2Gi ", "1.5e-3m",
	"0.5", "1.", "+1", "-0", "999999999999999999", "1000000000000000001", "12345678901234567890Ei",
}

func FuzzParseQuantity(f *testing.F) {
	for _, s := range quantitySeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		q, err := ParseQuantity(CPUKey, value)
		if err != nil {
			fuzzCheckError(t, err, CPUKey, value)
			return
		}
		if q.Sign() < 0 || q.Cmp(maxQuantity) > 0 {
			t.Fatalf("ParseQuantity(%q) = %s, out of [0, 1e18]", value, q.String())
		}
		back, perr := resource.ParseQuantity(q.String())
		if perr != nil || back.Cmp(q) != 0 {
			t.Fatalf("ParseQuantity(%q) = %q, which reads back as %v, %v", value, q.String(), back.String(), perr)
		}
		// Agrees with resource.ParseQuantity on what it accepts.
		ref, rerr := resource.ParseQuantity(strings.TrimSpace(value))
		if rerr != nil || ref.Cmp(q) != 0 {
			t.Fatalf("ParseQuantity(%q) = %s, resource.ParseQuantity gives %s, %v", value, q.String(), ref.String(), rerr)
		}
	})
}

func FuzzParseLabels(f *testing.F) {
	for _, s := range []string{
		"", ",", "a=b", "k1=v1,k2=v2", " a = b ,, c=d ", "k=", "a=b,a=c", "a", "=b", "a=b=c",
		"example.com/key=value", "ключ=значение", "a=🚀", "a/b/c=d", "a=b,\xff=c",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		labels, err := ParseLabels(LabelsKey, value)
		if err != nil {
			if labels != nil {
				t.Fatalf("labels %v alongside error %v", labels, err)
			}
			fuzzCheckError(t, err, LabelsKey, value)
			return
		}
		if labels != nil && len(labels) == 0 {
			t.Fatalf("empty non-nil map for %q", value)
		}
		items := make([]string, 0, len(labels))
		for k, v := range labels {
			if len(content.IsLabelKey(k)) > 0 || len(content.IsLabelValue(v)) > 0 {
				t.Fatalf("ParseLabels(%q) accepted invalid label %q=%q", value, k, v)
			}
			items = append(items, k+"="+v)
		}
		// Writing the labels back gives the same labels.
		again, err := ParseLabels(LabelsKey, strings.Join(items, ","))
		if err != nil || !reflect.DeepEqual(again, labels) {
			t.Fatalf("round trip of %v gave %v, %v", labels, again, err)
		}
	})
}

func FuzzParseTaints(f *testing.F) {
	for _, s := range []string{
		"", ",", "key=value:NoSchedule", "key:NoExecute", "key=:PreferNoSchedule",
		"a:NoSchedule,b=c:NoExecute", "k:NoSchedule,k:NoSchedule", "key", "key:", ":NoSchedule",
		"a:b:NoSchedule", "k=v=w:NoSchedule", " k = v : NoSchedule ,, ", "ключ:NoSchedule",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		taints, err := ParseTaints(TaintsKey, value)
		if err != nil {
			if taints != nil {
				t.Fatalf("taints %v alongside error %v", taints, err)
			}
			fuzzCheckError(t, err, TaintsKey, value)
			return
		}
		if taints != nil && len(taints) == 0 {
			t.Fatalf("empty non-nil slice for %q", value)
		}
		items := make([]string, 0, len(taints))
		for _, taint := range taints {
			switch taint.Effect {
			case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
			default:
				t.Fatalf("ParseTaints(%q) accepted effect %q", value, taint.Effect)
			}
			if len(content.IsLabelKey(taint.Key)) > 0 || len(content.IsLabelValue(taint.Value)) > 0 {
				t.Fatalf("ParseTaints(%q) accepted invalid taint %#v", value, taint)
			}
			items = append(items, taint.Key+"="+taint.Value+":"+string(taint.Effect))
		}
		again, err := ParseTaints(TaintsKey, strings.Join(items, ","))
		if err != nil || !reflect.DeepEqual(again, taints) {
			t.Fatalf("round trip of %v gave %v, %v", taints, again, err)
		}
	})
}

func FuzzParse(f *testing.F) {
	f.Add("4", "16Gi", "100Gi", "110", "1", "nvidia.com/gpu", "a=b", "k=v:NoSchedule")
	f.Add("0", "-1", "", "0", "-1", "", "a", "k")
	f.Add("lots", "1e400", "1Ei", "x", "1.5", "cpu", "a=b,a=c", "k:NoSchedule,k:NoSchedule")
	f.Fuzz(func(t *testing.T, cpu, memory, disk, maxPods, gpuCount, gpuType, labels, taints string) {
		annotations := map[string]string{
			CPUKey: cpu, MemoryKey: memory, EphemeralDiskKey: disk, MaxPodsKey: maxPods,
			GPUCountKey: gpuCount, GPUTypeKey: gpuType, LabelsKey: labels, TaintsKey: taints,
		}
		got, errs := Parse(annotations)
		for _, err := range errs {
			value, ok := annotations[err.Key]
			if !ok {
				t.Fatalf("error for unknown key: %v", err)
			}
			fuzzCheckError(t, err, err.Key, value)
		}
		for name, q := range got.Resources {
			if q.Sign() < 0 || q.Cmp(maxQuantity) > 0 {
				t.Fatalf("resource %s = %s out of range", name, q.String())
			}
			if (name == corev1.ResourceCPU || name == corev1.ResourceMemory || name == corev1.ResourcePods) && q.Sign() <= 0 {
				t.Fatalf("resource %s = %s, want > 0", name, q.String())
			}
		}
		// Every annotation ends up either in the result or in an error.
		reported := map[string]bool{}
		for _, err := range errs {
			if reported[err.Key] {
				t.Fatalf("key %s reported twice", err.Key)
			}
			reported[err.Key] = true
		}
		for key, name := range map[string]corev1.ResourceName{
			CPUKey: corev1.ResourceCPU, MemoryKey: corev1.ResourceMemory,
			EphemeralDiskKey: corev1.ResourceEphemeralStorage, MaxPodsKey: corev1.ResourcePods,
		} {
			_, have := got.Resources[name]
			if have == reported[key] {
				t.Fatalf("%s: in result %v, reported %v", key, have, reported[key])
			}
		}
		// Same input, same output.
		again, againErrs := Parse(annotations)
		if !reflect.DeepEqual(again, got) || !reflect.DeepEqual(againErrs, errs) {
			t.Fatalf("Parse is not deterministic")
		}
	})
}
