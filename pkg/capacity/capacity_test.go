package capacity

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// checkFieldError fails t unless err names key, keeps value verbatim, and
// quotes both in its message.
func checkFieldError(t *testing.T, err *FieldError, key, value string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one for %q", value)
	}
	if err.Key != key || err.Value != value {
		t.Errorf("FieldError{Key: %q, Value: %q}, want Key %q, Value %q", err.Key, err.Value, key, value)
	}
	if err.Reason == "" {
		t.Errorf("FieldError has no Reason")
	}
	msg := err.Error()
	prefix := "annotation " + strconv.Quote(key) + ": " + quote(value) + " "
	if !strings.HasPrefix(msg, prefix) {
		t.Errorf("Error() = %q, want prefix %q", msg, prefix)
	}
}

func TestFieldErrorMessage(t *testing.T) {
	err := &FieldError{Key: CPUKey, Value: "lots", Reason: "is not a quantity: x"}
	want := `annotation "capacity.cluster-autoscaler.kubernetes.io/cpu": "lots" is not a quantity: x`
	if got := err.Error(); got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	var nilErr *FieldError
	if got := nilErr.Error(); got != "<nil>" {
		t.Errorf("nil Error() = %q", got)
	}
}

func TestFieldErrorLongValue(t *testing.T) {
	for _, value := range []string{
		strings.Repeat("x", 100_000),
		strings.Repeat("é", 1000), // 2-byte runes: the cut must not split one
		strings.Repeat("\xff", 1000),
	} {
		err := &FieldError{Key: LabelsKey, Value: value, Reason: "is bad"}
		msg := err.Error()
		if len(msg) > 2000 {
			t.Errorf("Error() is %d bytes long, want it bounded", len(msg))
		}
		if !strings.Contains(msg, "("+strconv.Itoa(len(value))+" bytes)") {
			t.Errorf("Error() = %q, want the total length", msg)
		}
		if !strings.HasPrefix(msg, `annotation "`+LabelsKey+`": "`) {
			t.Errorf("Error() = %q, want key and quoted value", msg)
		}
	}
	if got := quote(strings.Repeat("é", 1000)); strings.Contains(got, `\x`) {
		t.Errorf("quote split a rune: %s", got)
	}
}

func TestParseQuantity(t *testing.T) {
	good := []struct {
		value string
		want  string // canonical String() of the result
	}{
		{"0", "0"},
		{"1", "1"},
		{"4", "4"},
		{"3500m", "3500m"},
		{"0.5", "500m"},
		{".5", "500m"},
		{"1.", "1"},
		{"+1", "1"},
		{"1.5e3", "1500"},
		{"1e3", "1e3"},
		{"1E3", "1e3"},
		{"1e+3", "1e3"},
		{"5e-2", "50e-3"},
		{"1e-64", "1e-9"}, // rounded up to the smallest unit by resource.ParseQuantity
		{"16Gi", "16Gi"},
		{"0.5Gi", "512Mi"},
		{"100G", "100G"},
		{"1e18", "1e18"},
		{"1E", "1E"},
		{"1000000000000000000", "1E"},
		{"  2Gi\t\n", "2Gi"},
		{"\u00a02\u00a0", "2"}, // non-breaking spaces count as whitespace
		{"007", "7"},
		{"1" + strings.Repeat("0", 17), "100P"},
	}
	for _, tc := range good {
		t.Run("good/"+tc.value, func(t *testing.T) {
			q, err := ParseQuantity(CPUKey, tc.value)
			if err != nil {
				t.Fatalf("ParseQuantity(%q) error: %v", tc.value, err)
			}
			if tc.want != "" && q.String() != tc.want {
				t.Errorf("ParseQuantity(%q) = %s, want %s", tc.value, q.String(), tc.want)
			}
			if q.Sign() < 0 || q.Cmp(maxQuantity) > 0 {
				t.Errorf("ParseQuantity(%q) = %s, out of range", tc.value, q.String())
			}
		})
	}
	if q, _ := ParseQuantity(MemoryKey, "512Pi"); q.Value() != 1<<59 {
		t.Errorf("512Pi = %d", q.Value())
	}

	bad := []struct {
		value  string
		reason string // substring of Reason
	}{
		{"", "is not a quantity"},
		{"   ", "is not a quantity"},
		{"lots", "is not a quantity"},
		{"-1", "must not be negative"},
		{"-0", "must not be negative"},
		{"-1Gi", "must not be negative"},
		{"-lots", "is not a quantity"},
		{".", "no digits"},
		{"+", "no digits"},
		{"-", "no digits"},
		{"e3", "no digits"},
		{"Gi", "no digits"},
		{"NaN", "is not a quantity"},
		{"nan", "is not a quantity"},
		{"Inf", "is not a quantity"},
		{"+Inf", "is not a quantity"},
		{"infinity", "is not a quantity"},
		{"0x10", "is not a quantity"},
		{"1_000", "is not a quantity"},
		{"1,5", "is not a quantity"},
		{"1 Gi", "is not a quantity"},
		{"1e", "is not a quantity"},
		{"1e+", "is not a quantity"},
		{"1.5e-3m", "is not a quantity"},
		{"1Gb", "is not a quantity"},
		{"1..2", "is not a quantity"},
		{"４", "is not a quantity"}, // full-width digit
		{"1e19", "too large"},
		{"1000000000000000001", "too large"},
		{"1.000000000000000001E", "too large"},
		{"1Ei", "too large"},    // 2^60 > 1e18
		{"8Ei", "too large"},    // resource.ParseQuantity caps this at MaxInt64
		{"1000Ei", "too large"}, // ditto
		{"1e65", "exponent out of range"},
		{"1e-65", "exponent out of range"},
		{"1e400", "exponent out of range"},
		{"1e4294967296", "exponent out of range"},  // resource.ParseQuantity truncates this to 1
		{"1e-2147483648", "exponent out of range"}, // resource.ParseQuantity takes minutes on this
		{"1e99999999999999999999", "exponent out of range"},
		{"2e55555555555555", "exponent out of range"}, // regression (from FuzzEstimate in pkg/pricing): resource.ParseQuantity takes ~100s on this
		{strings.Repeat("9", 65), "longer than"},
		{"0." + strings.Repeat("0", 70) + "1", "longer than"},
	}
	for _, tc := range bad {
		t.Run("bad/"+tc.value, func(t *testing.T) {
			start := time.Now()
			q, err := ParseQuantity(CPUKey, tc.value)
			if d := time.Since(start); d > time.Second {
				t.Errorf("ParseQuantity(%q) took %v", tc.value, d)
			}
			checkFieldError(t, err, CPUKey, tc.value)
			if err != nil && !strings.Contains(err.Reason, tc.reason) {
				t.Errorf("Reason = %q, want it to contain %q", err.Reason, tc.reason)
			}
			if !q.IsZero() {
				t.Errorf("got quantity %s alongside an error", q.String())
			}
		})
	}
}

func TestParseQuantityExample(t *testing.T) {
	_, err := ParseQuantity(CPUKey, "lots")
	want := `annotation "capacity.cluster-autoscaler.kubernetes.io/cpu": "lots" is not a quantity: `
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error = %v, want prefix %q", err, want)
	}
}

func TestParseLabels(t *testing.T) {
	good := []struct {
		value string
		want  map[string]string
	}{
		{"", nil},
		{"   ", nil},
		{",", nil},
		{" , ,, ", nil},
		{"a=b", map[string]string{"a": "b"}},
		{"k1=v1,k2=v2", map[string]string{"k1": "v1", "k2": "v2"}},
		{" k1=v1 , k2=v2 ", map[string]string{"k1": "v1", "k2": "v2"}},
		{"a = b", map[string]string{"a": "b"}},
		{"a=b,,c=d", map[string]string{"a": "b", "c": "d"}},
		{"a=b,", map[string]string{"a": "b"}},
		{",a=b", map[string]string{"a": "b"}},
		{"k=", map[string]string{"k": ""}},
		{"k=,j=x", map[string]string{"k": "", "j": "x"}},
		{"node.kubernetes.io/instance-type=m5.large", map[string]string{"node.kubernetes.io/instance-type": "m5.large"}},
		{"example.com/My_Key-1.x=Some.Value_2", map[string]string{"example.com/My_Key-1.x": "Some.Value_2"}},
		{strings.Repeat("k", 63) + "=" + strings.Repeat("v", 63), map[string]string{strings.Repeat("k", 63): strings.Repeat("v", 63)}},
		{"\tgpu=true\n", map[string]string{"gpu": "true"}},
	}
	for _, tc := range good {
		t.Run("good/"+tc.value, func(t *testing.T) {
			got, err := ParseLabels(LabelsKey, tc.value)
			if err != nil {
				t.Fatalf("ParseLabels(%q) error: %v", tc.value, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ParseLabels(%q) = %#v, want %#v", tc.value, got, tc.want)
			}
		})
	}

	bad := []struct {
		value  string
		reason string
	}{
		{"a", `item 1 ("a") has no "="`},
		{"a=b,c", `item 2 ("c") has no "="`},
		{"=b", "invalid label key"},
		{" =b", "invalid label key"},
		{"a b=c", "invalid label key"},
		{"-a=b", "invalid label key"},
		{"a/b/c=d", "invalid label key"},
		{"/a=b", "invalid label key"},
		{"a/=b", "invalid label key"},
		{"Example.com/a=b", "invalid label key"},
		{strings.Repeat("k", 64) + "=v", "invalid label key"},
		{"a=b=c", "invalid value"},
		{"a=-b", "invalid value"},
		{"a=b c", "invalid value"},
		{"a=" + strings.Repeat("v", 64), "invalid value"},
		{"a=b,a=c", `sets label "a" more than once`},
		{"a=b,a=b", `sets label "a" more than once`},
		{"a=b;c=d", "invalid value"},
		{"a:b", `has no "="`},
		{"ключ=значение", "invalid label key"},
		{"key=значение", "invalid value"},
		{"emoji=🚀", "invalid value"},
		{"a=b\x00", "invalid value"},
		{"a=\xff", "invalid value"},
		{strings.Repeat("a=b,b=c,", 5000) + "x", `sets label "a" more than once`},
		{strings.Repeat(",", 10000) + "x", `item 10001 ("x") has no "="`},
	}
	for _, tc := range bad {
		name := tc.value
		if len(name) > 40 {
			name = name[:40]
		}
		t.Run("bad/"+name, func(t *testing.T) {
			got, err := ParseLabels(LabelsKey, tc.value)
			checkFieldError(t, err, LabelsKey, tc.value)
			if err != nil && !strings.Contains(err.Reason, tc.reason) {
				t.Errorf("Reason = %q, want it to contain %q", err.Reason, tc.reason)
			}
			if got != nil {
				t.Errorf("got labels %v alongside an error", got)
			}
		})
	}
}

func TestParseLabelsMany(t *testing.T) {
	var items []string
	for i := range 5000 {
		items = append(items, "k"+strconv.Itoa(i)+"=v"+strconv.Itoa(i))
	}
	got, err := ParseLabels(LabelsKey, strings.Join(items, ","))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 5000 || got["k4999"] != "v4999" {
		t.Errorf("got %d labels", len(got))
	}
}

func TestParseTaints(t *testing.T) {
	good := []struct {
		value string
		want  []corev1.Taint
	}{
		{"", nil},
		{" ", nil},
		{",,", nil},
		{"key=value:NoSchedule", []corev1.Taint{{Key: "key", Value: "value", Effect: corev1.TaintEffectNoSchedule}}},
		{"key:NoExecute", []corev1.Taint{{Key: "key", Effect: corev1.TaintEffectNoExecute}}},
		{"key=:PreferNoSchedule", []corev1.Taint{{Key: "key", Effect: corev1.TaintEffectPreferNoSchedule}}},
		{"key=value:NoSchedule,key2:NoExecute", []corev1.Taint{
			{Key: "key", Value: "value", Effect: corev1.TaintEffectNoSchedule},
			{Key: "key2", Effect: corev1.TaintEffectNoExecute},
		}},
		{" b:NoSchedule , a:NoSchedule ,, ", []corev1.Taint{ // input order is kept
			{Key: "b", Effect: corev1.TaintEffectNoSchedule},
			{Key: "a", Effect: corev1.TaintEffectNoSchedule},
		}},
		{"key = value : NoSchedule", []corev1.Taint{{Key: "key", Value: "value", Effect: corev1.TaintEffectNoSchedule}}},
		{"nvidia.com/gpu=present:NoSchedule", []corev1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}}},
		{"k:NoSchedule,k:NoExecute", []corev1.Taint{ // same key, different effects
			{Key: "k", Effect: corev1.TaintEffectNoSchedule},
			{Key: "k", Effect: corev1.TaintEffectNoExecute},
		}},
	}
	for _, tc := range good {
		t.Run("good/"+tc.value, func(t *testing.T) {
			got, err := ParseTaints(TaintsKey, tc.value)
			if err != nil {
				t.Fatalf("ParseTaints(%q) error: %v", tc.value, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ParseTaints(%q) = %#v, want %#v", tc.value, got, tc.want)
			}
		})
	}

	bad := []struct {
		value  string
		reason string
	}{
		{"key", `item 1 ("key") has no ":Effect"`},
		{"key=value", `has no ":Effect"`},
		{"a:NoSchedule,b", `item 2 ("b") has no ":Effect"`},
		{"key:", "invalid taint effect"},
		{"key:noschedule", "invalid taint effect"},
		{"key:NoScheduleX", "invalid taint effect"},
		{"key:Evict", "invalid taint effect"},
		{":NoSchedule", "invalid taint key"},
		{"=v:NoSchedule", "invalid taint key"},
		{"a:b:NoSchedule", "invalid taint key"},
		{"k=a:b:NoSchedule", "invalid value"},
		{"k=v=w:NoSchedule", "invalid value"},
		{"k=-v:NoSchedule", "invalid value"},
		{"k y:NoSchedule", "invalid taint key"},
		{strings.Repeat("k", 64) + ":NoSchedule", "invalid taint key"},
		{"k=" + strings.Repeat("v", 64) + ":NoSchedule", "invalid value"},
		{"k:NoSchedule,k=v:NoSchedule", `has taint "k" with effect NoSchedule more than once`},
		{"ключ:NoSchedule", "invalid taint key"},
		{"k:NoSchedule\x00", "invalid taint effect"},
	}
	for _, tc := range bad {
		t.Run("bad/"+tc.value, func(t *testing.T) {
			got, err := ParseTaints(TaintsKey, tc.value)
			checkFieldError(t, err, TaintsKey, tc.value)
			if err != nil && !strings.Contains(err.Reason, tc.reason) {
				t.Errorf("Reason = %q, want it to contain %q", err.Reason, tc.reason)
			}
			if got != nil {
				t.Errorf("got taints %v alongside an error", got)
			}
		})
	}
}

func TestParseTaintsMany(t *testing.T) {
	var items []string
	for i := range 20000 {
		items = append(items, "k"+strconv.Itoa(i)+":NoSchedule")
	}
	start := time.Now()
	got, err := ParseTaints(TaintsKey, strings.Join(items, ","))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 20000 || got[19999].Key != "k19999" {
		t.Errorf("got %d taints", len(got))
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
}

func mustQ(s string) resource.Quantity { return resource.MustParse(s) }

// sameResources compares resource lists by quantity value.
func sameResources(a, b corev1.ResourceList) bool {
	if len(a) != len(b) || (a == nil) != (b == nil) {
		return false
	}
	for name, qa := range a {
		qb, ok := b[name]
		if !ok || qa.Cmp(qb) != 0 {
			return false
		}
	}
	return true
}

func TestParse(t *testing.T) {
	type errWant struct{ key, reason string }
	tests := []struct {
		name        string
		annotations map[string]string
		want        Capacity
		errs        []errWant
	}{
		{name: "nil map"},
		{name: "no capacity annotations", annotations: map[string]string{"foo": "bar", "cluster.x-k8s.io/x": "1"}},
		{
			name:        "unknown keys under the prefix are ignored",
			annotations: map[string]string{AnnotationPrefix + "nodes": "lots", AnnotationPrefix: "x", AnnotationPrefix + "CPU": "x"},
		},
		{
			name: "everything",
			annotations: map[string]string{
				CPUKey:           "4",
				MemoryKey:        "16Gi",
				EphemeralDiskKey: "100Gi",
				MaxPodsKey:       "110",
				GPUCountKey:      "2",
				GPUTypeKey:       "amd.com/gpu",
				LabelsKey:        "a=b,c=",
				TaintsKey:        "gpu=true:NoSchedule",
				"unrelated":      "x",
			},
			want: Capacity{
				Resources: corev1.ResourceList{
					corev1.ResourceCPU:              mustQ("4"),
					corev1.ResourceMemory:           mustQ("16Gi"),
					corev1.ResourceEphemeralStorage: mustQ("100Gi"),
					corev1.ResourcePods:             mustQ("110"),
					"amd.com/gpu":                   mustQ("2"),
				},
				Labels: map[string]string{"a": "b", "c": ""},
				Taints: []corev1.Taint{{Key: "gpu", Value: "true", Effect: corev1.TaintEffectNoSchedule}},
			},
		},
		{
			name:        "gpu-type defaults to nvidia.com/gpu",
			annotations: map[string]string{GPUCountKey: "1"},
			want:        Capacity{Resources: corev1.ResourceList{"nvidia.com/gpu": mustQ("1")}},
		},
		{
			name:        "zero GPUs",
			annotations: map[string]string{GPUCountKey: " 0 "},
			want:        Capacity{Resources: corev1.ResourceList{"nvidia.com/gpu": mustQ("0")}},
		},
		{
			name:        "gpu-type alone adds nothing",
			annotations: map[string]string{GPUTypeKey: "nvidia.com/gpu"},
		},
		{
			name:        "bad gpu-type drops the GPUs",
			annotations: map[string]string{GPUCountKey: "1", GPUTypeKey: "nvidia.com/gpu/x", CPUKey: "2"},
			want:        Capacity{Resources: corev1.ResourceList{corev1.ResourceCPU: mustQ("2")}},
			errs:        []errWant{{GPUTypeKey, "is not a valid resource name"}},
		},
		{
			name:        "gpu-type must not be a standard resource",
			annotations: map[string]string{GPUCountKey: "1", GPUTypeKey: "cpu"},
			errs:        []errWant{{GPUTypeKey, "standard resource"}},
		},
		{
			name:        "empty gpu-type",
			annotations: map[string]string{GPUCountKey: "1", GPUTypeKey: ""},
			errs:        []errWant{{GPUTypeKey, "is not a valid resource name"}},
		},
		{
			name:        "bad gpu-count, bad gpu-type",
			annotations: map[string]string{GPUCountKey: "-1", GPUTypeKey: "!"},
			errs:        []errWant{{GPUCountKey, "out of range"}, {GPUTypeKey, "is not a valid resource name"}},
		},
		{
			name:        "zero disk is fine",
			annotations: map[string]string{EphemeralDiskKey: "0"},
			want:        Capacity{Resources: corev1.ResourceList{corev1.ResourceEphemeralStorage: mustQ("0")}},
		},
		{
			name:        "cpu and memory must be positive",
			annotations: map[string]string{CPUKey: "0", MemoryKey: "0Gi", EphemeralDiskKey: "1Gi"},
			want:        Capacity{Resources: corev1.ResourceList{corev1.ResourceEphemeralStorage: mustQ("1Gi")}},
			errs:        []errWant{{CPUKey, "must be greater than zero"}, {MemoryKey, "must be greater than zero"}},
		},
		{
			name: "bad values are skipped and reported in a fixed order, good ones kept",
			annotations: map[string]string{
				CPUKey:           "lots",
				MemoryKey:        "8Gi",
				EphemeralDiskKey: "-1",
				MaxPodsKey:       "0",
				GPUCountKey:      "1.5",
				LabelsKey:        "a",
				TaintsKey:        "k:Sometimes",
			},
			want: Capacity{Resources: corev1.ResourceList{corev1.ResourceMemory: mustQ("8Gi")}},
			errs: []errWant{
				{CPUKey, "is not a quantity"},
				{EphemeralDiskKey, "must not be negative"},
				{MaxPodsKey, "out of range"},
				{GPUCountKey, "is not an integer"},
				{LabelsKey, `has no "="`},
				{TaintsKey, "invalid taint effect"},
			},
		},
		{
			name:        "maxPods",
			annotations: map[string]string{MaxPodsKey: "\t58\n"},
			want:        Capacity{Resources: corev1.ResourceList{corev1.ResourcePods: mustQ("58")}},
		},
		{
			name: "integer limits",
			annotations: map[string]string{
				MaxPodsKey:  "1000001",
				GPUCountKey: "99999999999999999999",
			},
			errs: []errWant{{MaxPodsKey, "out of range"}, {GPUCountKey, "out of range"}},
		},
		{
			name: "integers are plain decimal",
			annotations: map[string]string{
				MaxPodsKey:  "1e2",
				GPUCountKey: "0x1",
			},
			errs: []errWant{{MaxPodsKey, "is not an integer"}, {GPUCountKey, "is not an integer"}},
		},
		{
			name:        "empty labels and taints mean none",
			annotations: map[string]string{LabelsKey: "", TaintsKey: " "},
		},
		{
			name:        "duplicate label keys are an error",
			annotations: map[string]string{LabelsKey: "a=1,a=2"},
			errs:        []errWant{{LabelsKey, "more than once"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, errs := Parse(tc.annotations)
			if !sameResources(got.Resources, tc.want.Resources) {
				t.Errorf("Resources = %v, want %v", got.Resources, tc.want.Resources)
			}
			if !reflect.DeepEqual(got.Labels, tc.want.Labels) {
				t.Errorf("Labels = %#v, want %#v", got.Labels, tc.want.Labels)
			}
			if !reflect.DeepEqual(got.Taints, tc.want.Taints) {
				t.Errorf("Taints = %#v, want %#v", got.Taints, tc.want.Taints)
			}
			if len(errs) != len(tc.errs) {
				t.Fatalf("errors = %v, want %d", errs, len(tc.errs))
			}
			for i, want := range tc.errs {
				checkFieldError(t, errs[i], want.key, tc.annotations[want.key])
				if !strings.Contains(errs[i].Reason, want.reason) {
					t.Errorf("error %d = %v, want it to contain %q", i, errs[i], want.reason)
				}
			}
		})
	}
}

// TestParseDeterministic checks that Parse gives the same answer every time,
// despite map iteration order.
func TestParseDeterministic(t *testing.T) {
	annotations := map[string]string{
		CPUKey: "x", MemoryKey: "y", EphemeralDiskKey: "z", MaxPodsKey: "w",
		GPUCountKey: "v", GPUTypeKey: "/", LabelsKey: "u", TaintsKey: "t",
	}
	first, firstErrs := Parse(annotations)
	for range 50 {
		got, errs := Parse(annotations)
		if !reflect.DeepEqual(got, first) || !reflect.DeepEqual(errs, firstErrs) {
			t.Fatalf("Parse is not deterministic: %v vs %v", errs, firstErrs)
		}
	}
	if len(firstErrs) != 8 {
		t.Errorf("got %d errors, want 8", len(firstErrs))
	}
}

// TestParseQuantityRoundTrip checks that accepted quantities print in a form
// that resource.ParseQuantity reads back to the same value.
func TestParseQuantityRoundTrip(t *testing.T) {
	for _, v := range []string{"+1", "1.", "0.5Gi", "1e3", "123.456789m", "1e-64", "1E", "999999999999999999", "0.1Ki"} {
		q, err := ParseQuantity(MemoryKey, v)
		if err != nil {
			t.Fatalf("%q: %v", v, err)
		}
		back, perr := resource.ParseQuantity(q.String())
		if perr != nil || back.Cmp(q) != 0 {
			t.Errorf("%q -> %q -> %v, %v", v, q.String(), back.String(), perr)
		}
	}
}
