// Package capacity parses the Cluster Autoscaler "scale-from-zero" capacity
// annotations (prefix "capacity.cluster-autoscaler.kubernetes.io/") that users
// put by hand on Cluster API MachineDeployments and infrastructure machine
// templates.
//
// The values are written by people, so every parser in this package is total:
// it never panics, whatever the input, and every problem is reported as a
// *FieldError that names the annotation key and quotes the offending value.
// The package does no I/O.
package capacity

import (
	"errors"
	"fmt"
	"github.com/autonode/karpenter-clusterapi/pkg/annotation"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/api/validate/content"
)

// AnnotationPrefix is the common prefix of every capacity annotation.
const AnnotationPrefix = "capacity.cluster-autoscaler.kubernetes.io/"

// Annotation keys understood by Parse.
const (
	// CPUKey holds the number of CPUs as a resource.Quantity, e.g. "4" or "3500m".
	CPUKey = AnnotationPrefix + "cpu"
	// MemoryKey holds the memory size as a resource.Quantity, e.g. "16Gi".
	MemoryKey = AnnotationPrefix + "memory"
	// EphemeralDiskKey holds the ephemeral storage size as a resource.Quantity, e.g. "100Gi".
	EphemeralDiskKey = AnnotationPrefix + "ephemeral-disk"
	// MaxPodsKey holds the maximum number of pods as a decimal integer, e.g. "110".
	MaxPodsKey = AnnotationPrefix + "maxPods"
	// GPUCountKey holds the number of GPUs as a decimal integer, e.g. "1".
	GPUCountKey = AnnotationPrefix + "gpu-count"
	// GPUTypeKey holds the extended resource name of the GPUs, e.g. "nvidia.com/gpu".
	GPUTypeKey = AnnotationPrefix + "gpu-type"
	// LabelsKey holds node labels as "k1=v1,k2=v2".
	LabelsKey = AnnotationPrefix + "labels"
	// TaintsKey holds node taints as "key=value:Effect,key2:Effect".
	TaintsKey = AnnotationPrefix + "taints"
)

// DefaultGPUType is the resource name used for gpu-count when gpu-type is absent.
const DefaultGPUType corev1.ResourceName = "nvidia.com/gpu"

// Limits applied to hand-written values.
const (
	// MaxQuantityLength is the longest quantity string (after trimming
	// surrounding whitespace) that ParseQuantity accepts.
	MaxQuantityLength = 64
	// MaxQuantityExponent bounds the decimal exponent of a quantity written in
	// scientific notation ("1e3", "5E-2"). It keeps resource.ParseQuantity away
	// from inputs such as "1e-2147483648" that take it minutes to round, and
	// from "1e4294967296" that it silently truncates to 1.
	MaxQuantityExponent = 64
	// MaxPods is the largest accepted maxPods value.
	MaxPods = 1_000_000
	// MaxGPUCount is the largest accepted gpu-count value.
	MaxGPUCount = 4096
)

// maxQuantity is the largest accepted quantity: 1e18 in the base unit
// (cores, bytes).
var maxQuantity = *resource.NewScaledQuantity(1, 18)

// Capacity is what the capacity annotations say about a node.
type Capacity struct {
	// Resources holds cpu, memory, ephemeral-storage (from ephemeral-disk),
	// pods (from maxPods) and the GPU resource named by gpu-type (from
	// gpu-count); only those present and valid. Nil when there are none.
	Resources corev1.ResourceList
	// Labels is nil when the labels annotation is absent, empty or invalid.
	Labels map[string]string
	// Taints keep the order of the annotation. Nil when the taints annotation
	// is absent, empty or invalid.
	Taints []corev1.Taint
}

// FieldError is a bad annotation value; Error() names the key and quotes the value.
type FieldError = annotation.FieldError

// quote quotes a value for a message, eliding the middle of huge ones.
func quote(s string) string { return annotation.Quote(s) }

func fieldError(key, value, format string, args ...any) *FieldError {
	return &FieldError{Key: key, Value: value, Reason: fmt.Sprintf(format, args...)}
}

// Parse reads every capacity annotation it knows; a bad value is skipped and
// reported, the others are still returned. Unknown keys under the prefix and
// keys outside it are ignored. Errors come in a fixed order: cpu, memory,
// ephemeral-disk, maxPods, gpu-count, gpu-type, labels, taints.
//
// Rules beyond those of the individual parsers:
//   - cpu and memory must be greater than zero; ephemeral-disk may be zero.
//   - maxPods must be an integer in [1, MaxPods]; gpu-count an integer in
//     [0, MaxGPUCount]. Surrounding whitespace is ignored.
//   - gpu-type must be a qualified name (e.g. "nvidia.com/gpu") and must not
//     be cpu, memory, ephemeral-storage or pods. It defaults to
//     DefaultGPUType. If it is present but invalid, it is reported and no GPU
//     resource is returned, even if gpu-count is valid. gpu-type without
//     gpu-count adds nothing.
func Parse(annotations map[string]string) (Capacity, []*FieldError) {
	var (
		out  Capacity
		errs []*FieldError
	)
	setResource := func(name corev1.ResourceName, q resource.Quantity) {
		if out.Resources == nil {
			out.Resources = corev1.ResourceList{}
		}
		out.Resources[name] = q
	}

	for _, r := range []struct {
		key      string
		name     corev1.ResourceName
		positive bool
	}{
		{CPUKey, corev1.ResourceCPU, true},
		{MemoryKey, corev1.ResourceMemory, true},
		{EphemeralDiskKey, corev1.ResourceEphemeralStorage, false},
	} {
		value, ok := annotations[r.key]
		if !ok {
			continue
		}
		q, err := ParseQuantity(r.key, value)
		if err == nil && r.positive && q.Sign() <= 0 {
			err = fieldError(r.key, value, "must be greater than zero")
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		setResource(r.name, q)
	}

	if value, ok := annotations[MaxPodsKey]; ok {
		n, err := parseInt(MaxPodsKey, value, 1, MaxPods)
		if err != nil {
			errs = append(errs, err)
		} else {
			setResource(corev1.ResourcePods, *resource.NewQuantity(n, resource.DecimalSI))
		}
	}

	gpuCount, haveGPUCount := int64(0), false
	if value, ok := annotations[GPUCountKey]; ok {
		n, err := parseInt(GPUCountKey, value, 0, MaxGPUCount)
		if err != nil {
			errs = append(errs, err)
		} else {
			gpuCount, haveGPUCount = n, true
		}
	}
	gpuType, gpuTypeOK := DefaultGPUType, true
	if value, ok := annotations[GPUTypeKey]; ok {
		name, err := parseGPUType(GPUTypeKey, value)
		if err != nil {
			errs = append(errs, err)
			gpuTypeOK = false
		} else {
			gpuType = name
		}
	}
	if haveGPUCount && gpuTypeOK {
		setResource(gpuType, *resource.NewQuantity(gpuCount, resource.DecimalSI))
	}

	if value, ok := annotations[LabelsKey]; ok {
		labels, err := ParseLabels(LabelsKey, value)
		if err != nil {
			errs = append(errs, err)
		} else {
			out.Labels = labels
		}
	}
	if value, ok := annotations[TaintsKey]; ok {
		taints, err := ParseTaints(TaintsKey, value)
		if err != nil {
			errs = append(errs, err)
		} else {
			out.Taints = taints
		}
	}
	return out, errs
}

// ParseQuantity parses a resource.Quantity written by hand, such as "4",
// "3500m" or "16Gi". Surrounding whitespace is ignored. It rejects, besides
// anything resource.ParseQuantity rejects:
//   - negative values (including "-0");
//   - NaN-like strings that resource.ParseQuantity reads as zero: "", ".",
//     "+", "e3" (the number must contain a digit);
//   - strings longer than MaxQuantityLength bytes and decimal exponents
//     beyond ±MaxQuantityExponent;
//   - values above 1e18 in the base unit (cores, bytes).
//
// Zero is accepted. The returned quantity is in canonical form ("+1" and "1."
// become "1").
func ParseQuantity(key, value string) (resource.Quantity, *FieldError) {
	s := strings.TrimSpace(value)
	if len(s) > MaxQuantityLength {
		return resource.Quantity{}, fieldError(key, value, "is not a quantity: longer than %d characters", MaxQuantityLength)
	}
	negative, reason := checkQuantitySyntax(s)
	if reason != "" {
		return resource.Quantity{}, fieldError(key, value, "is not a quantity: %s", reason)
	}
	if negative {
		return resource.Quantity{}, fieldError(key, value, "must not be negative")
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return resource.Quantity{}, fieldError(key, value, "is not a quantity: %v", err)
	}
	if q.Sign() < 0 { // unreachable given the syntax check; kept as a guard
		return resource.Quantity{}, fieldError(key, value, "must not be negative")
	}
	if q.Cmp(maxQuantity) > 0 {
		return resource.Quantity{}, fieldError(key, value, "is too large: must be at most 1e18")
	}
	// Drop the string cached by resource.ParseQuantity so that the value
	// prints in canonical form: Add on a zero Quantity takes the format of its
	// argument and clears the cache.
	var canonical resource.Quantity
	canonical.Add(q)
	return canonical, nil
}

// checkQuantitySyntax does the checks resource.ParseQuantity lacks. It reports
// whether the number has a minus sign, or why s is not a quantity.
func checkQuantitySyntax(s string) (negative bool, reason string) {
	if s == "" {
		return false, "empty"
	}
	i := 0
	switch s[0] {
	case '-':
		negative = true
		i++
	case '+':
		i++
	}
	digits := 0
	for ; i < len(s) && isDigit(s[i]); i++ {
		digits++
	}
	if i < len(s) && s[i] == '.' {
		for i++; i < len(s) && isDigit(s[i]); i++ {
			digits++
		}
	}
	if digits == 0 {
		return negative, "no digits in the number"
	}
	suffix := s[i:]
	if len(suffix) < 2 || (suffix[0] != 'e' && suffix[0] != 'E') {
		return negative, ""
	}
	exp := suffix[1:]
	if exp[0] == '+' || exp[0] == '-' {
		exp = exp[1:]
	}
	if exp == "" || !allDigits(exp) {
		return negative, "" // a binary suffix like "Ei", or junk resource.ParseQuantity rejects
	}
	n, err := strconv.ParseInt(suffix[1:], 10, 64)
	if err != nil || n > MaxQuantityExponent || n < -MaxQuantityExponent {
		return negative, fmt.Sprintf("exponent out of range [-%d, %d]", MaxQuantityExponent, MaxQuantityExponent)
	}
	return negative, ""
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}

// parseInt parses a decimal integer in [lo, hi], ignoring surrounding whitespace.
func parseInt(key, value string, lo, hi int64) (int64, *FieldError) {
	s := strings.TrimSpace(value)
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return 0, fieldError(key, value, "is out of range: must be between %d and %d", lo, hi)
		}
		return 0, fieldError(key, value, "is not an integer")
	}
	if n < lo || n > hi {
		return 0, fieldError(key, value, "is out of range: must be between %d and %d", lo, hi)
	}
	return n, nil
}

// parseGPUType validates a gpu-type value as an extended resource name.
func parseGPUType(key, value string) (corev1.ResourceName, *FieldError) {
	s := strings.TrimSpace(value)
	if msgs := content.IsLabelKey(s); len(msgs) > 0 {
		return "", fieldError(key, value, "is not a valid resource name: %s", strings.Join(msgs, "; "))
	}
	switch name := corev1.ResourceName(s); name {
	case corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage, corev1.ResourcePods:
		return "", fieldError(key, value, "is not a valid GPU resource name: %q is a standard resource", s)
	default:
		return name, nil
	}
}

// ParseLabels parses "k1=v1,k2=v2". Whitespace around items, keys and values
// is ignored, and so are empty items ("a=b,,c=d"). "k=" gives k an empty
// value. Keys must be qualified names (an optional DNS subdomain prefix and
// "/", then a name of at most 63 characters) and values valid label values.
// A key given twice is an error. An empty (or all-blank) value means no
// labels and returns a nil map and no error.
func ParseLabels(key, value string) (map[string]string, *FieldError) {
	var labels map[string]string
	for n, item := range strings.Split(value, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		k, v, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fieldError(key, value, "is not a list of key=value: item %d (%s) has no \"=\"", n+1, quote(item))
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if msgs := content.IsLabelKey(k); len(msgs) > 0 {
			return nil, fieldError(key, value, "has an invalid label key %s: %s", quote(k), strings.Join(msgs, "; "))
		}
		if msgs := content.IsLabelValue(v); len(msgs) > 0 {
			return nil, fieldError(key, value, "has an invalid value %s for label %q: %s", quote(v), k, strings.Join(msgs, "; "))
		}
		if _, dup := labels[k]; dup {
			return nil, fieldError(key, value, "sets label %q more than once", k)
		}
		if labels == nil {
			labels = map[string]string{}
		}
		labels[k] = v
	}
	return labels, nil
}

// ParseTaints parses "key=value:Effect,key2:Effect" into taints in input
// order. The value is optional ("key:Effect" and "key=:Effect" both give an
// empty value). Effect is one of NoSchedule, PreferNoSchedule and NoExecute,
// case-sensitive. Keys must be qualified names and values valid label values.
// Whitespace around items and their parts is ignored, and so are empty items.
// Two taints with the same key and effect are an error, as in a Node spec. An
// empty (or all-blank) value means no taints and returns nil and no error.
func ParseTaints(key, value string) ([]corev1.Taint, *FieldError) {
	type keyEffect struct {
		key    string
		effect corev1.TaintEffect
	}
	var (
		taints []corev1.Taint
		seen   = map[keyEffect]bool{}
	)
	for n, item := range strings.Split(value, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		colon := strings.LastIndexByte(item, ':')
		if colon < 0 {
			return nil, fieldError(key, value, "is not a list of key=value:Effect: item %d (%s) has no \":Effect\"", n+1, quote(item))
		}
		keyValue, effect := item[:colon], corev1.TaintEffect(strings.TrimSpace(item[colon+1:]))
		switch effect {
		case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			return nil, fieldError(key, value, "has an invalid taint effect %s in item %d: must be NoSchedule, PreferNoSchedule or NoExecute", quote(string(effect)), n+1)
		}
		k, v, _ := strings.Cut(keyValue, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if msgs := content.IsLabelKey(k); len(msgs) > 0 {
			return nil, fieldError(key, value, "has an invalid taint key %s: %s", quote(k), strings.Join(msgs, "; "))
		}
		if msgs := content.IsLabelValue(v); len(msgs) > 0 {
			return nil, fieldError(key, value, "has an invalid value %s for taint %q: %s", quote(v), k, strings.Join(msgs, "; "))
		}
		if seen[keyEffect{k, effect}] {
			return nil, fieldError(key, value, "has taint %q with effect %s more than once", k, effect)
		}
		seen[keyEffect{k, effect}] = true
		taints = append(taints, corev1.Taint{Key: k, Value: v, Effect: effect})
	}
	return taints, nil
}
