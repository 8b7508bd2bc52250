package kubelet

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/autonode/karpenter-clusterapi/pkg/annotation"
	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// The kubeadm bootstrap provider's (CABPK) group and the kinds whose kubelet
// arguments this package reads.
const (
	KubeadmGroup              = "bootstrap.cluster.x-k8s.io"
	KubeadmConfigTemplateKind = "KubeadmConfigTemplate"
	KubeadmConfigKind         = "KubeadmConfig"
)

// kubeletExtraArgsPath is where a KubeadmConfig spec keeps the kubelet
// arguments of a joining node.
var kubeletExtraArgsPath = []string{"joinConfiguration", "nodeRegistration", "kubeletExtraArgs"}

// FromKubeadmConfigTemplate reads the kubelet settings a KubeadmConfigTemplate
// gives its nodes: spec.template.spec.joinConfiguration.nodeRegistration.kubeletExtraArgs,
// in either shape CABPK has served (v1beta2: a list of {name, value}, a later
// duplicate winning as in the kubelet's flag parsing; v1beta1: a map). Bad
// values are skipped and returned as errors whose key names the template and
// the flag. Settings the template gives in other ways (a KubeletConfiguration
// in spec.template.spec.files, patches) are not read: declare them in the
// NodeClass's spec.kubelet.
func FromKubeadmConfigTemplate(u *unstructured.Unstructured) (Config, []*annotation.FieldError) {
	return fromKubeadm(u, append([]string{"spec", "template", "spec"}, kubeletExtraArgsPath...))
}

// FromKubeadmConfig is FromKubeadmConfigTemplate for a KubeadmConfig
// (spec.joinConfiguration.nodeRegistration.kubeletExtraArgs).
func FromKubeadmConfig(u *unstructured.Unstructured) (Config, []*annotation.FieldError) {
	return fromKubeadm(u, append([]string{"spec"}, kubeletExtraArgsPath...))
}

func fromKubeadm(u *unstructured.Unstructured, path []string) (Config, []*annotation.FieldError) {
	if u == nil {
		return Config{}, nil
	}
	where := fmt.Sprintf("%s %s/%s %s", u.GetKind(), u.GetNamespace(), u.GetName(), strings.Join(path, "."))
	raw, found, _ := unstructured.NestedFieldNoCopy(u.Object, path...)
	if !found || raw == nil {
		return Config{}, nil
	}
	flags := map[string]string{}
	switch args := raw.(type) {
	case []any: // v1beta2: [{name, value}]
		for i, item := range args {
			m, ok := item.(map[string]any)
			name, nameOK := m["name"].(string)
			if !ok || !nameOK || name == "" {
				return Config{}, []*annotation.FieldError{annotation.Errorf(where, fmt.Sprint(item), "is not a {name, value} argument (item %d)", i)}
			}
			value, err := argValue(m["value"])
			if err != nil {
				return Config{}, []*annotation.FieldError{annotation.Errorf(where+" "+name, fmt.Sprint(m["value"]), "%v", err)}
			}
			flags[name] = value
		}
	case map[string]any: // v1beta1: {name: value}
		for name, v := range args {
			value, err := argValue(v)
			if err != nil {
				return Config{}, []*annotation.FieldError{annotation.Errorf(where+" "+name, fmt.Sprint(v), "%v", err)}
			}
			flags[name] = value
		}
	default:
		return Config{}, []*annotation.FieldError{annotation.Errorf(where, fmt.Sprint(raw), "is neither a list of {name, value} nor a map of arguments")}
	}
	return ParseFlags(where, flags)
}

func argValue(v any) (string, error) {
	switch x := v.(type) {
	case nil:
		return "", nil
	case string:
		return x, nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	case bool:
		return strconv.FormatBool(x), nil
	}
	return "", fmt.Errorf("is not a string")
}

// FromNodeClass reads a NodeClass's spec.kubelet. Bad values are skipped
// (that field falls back to the next source) and returned as errors naming
// the field.
func FromNodeClass(k *v1alpha1.KubeletConfiguration) (Config, []*annotation.FieldError) {
	var cfg Config
	if k == nil {
		return cfg, nil
	}
	var errs []*annotation.FieldError
	if k.MaxPods != nil {
		if n := int64(*k.MaxPods); n < 1 || n > 1_000_000 {
			errs = append(errs, annotation.Errorf("spec.kubelet.maxPods", strconv.FormatInt(n, 10), "is not a pod count between 1 and 1000000"))
		} else {
			cfg.MaxPods = &n
		}
	}
	for _, f := range []struct {
		field string
		in    map[string]string
		into  *corev1.ResourceList
	}{{"kubeReserved", k.KubeReserved, &cfg.KubeReserved}, {"systemReserved", k.SystemReserved, &cfg.SystemReserved}} {
		if f.in == nil {
			continue
		}
		rl := corev1.ResourceList{}
		var bad *annotation.FieldError
		for _, name := range sortedKeys(f.in) {
			q, err := parseReservation(name, strings.TrimSpace(f.in[name]))
			if err != nil {
				bad = annotation.Errorf("spec.kubelet."+f.field+"."+name, f.in[name], "%v", err)
				break
			}
			rl[corev1.ResourceName(name)] = q
		}
		if bad != nil {
			errs = append(errs, bad)
			continue
		}
		*f.into = rl
	}
	if k.EvictionHard != nil {
		m := map[string]string{}
		var bad *annotation.FieldError
		for _, signal := range sortedKeys(k.EvictionHard) {
			threshold := strings.TrimSpace(k.EvictionHard[signal])
			if !knownSignal(signal) {
				bad = annotation.Errorf("spec.kubelet.evictionHard."+signal, threshold, "is for a signal the kubelet does not know (%s)", strings.Join(EvictionSignals, ", "))
			} else if err := checkThreshold(signal, threshold); err != nil {
				bad = annotation.Errorf("spec.kubelet.evictionHard."+signal, threshold, "%v", err)
			}
			if bad != nil {
				break
			}
			m[signal] = threshold
		}
		if bad != nil {
			errs = append(errs, bad)
		} else {
			cfg.EvictionHard = m
		}
	}
	return cfg, errs
}

// Problem describes a bad kubelet setting for a NodeClass's status: where it
// is, the value and what is wrong, and that the next source is used.
func Problem(e *annotation.FieldError) string {
	return fmt.Sprintf("%s: %s %s; the next source of kubelet settings is used", e.Key, annotation.Quote(e.Value), e.Reason)
}

// Key identifies a configuration: equal configurations have equal keys.
func (c Config) Key() string {
	var b strings.Builder
	if c.MaxPods != nil {
		fmt.Fprintf(&b, "maxPods=%d", *c.MaxPods)
	}
	for _, f := range []struct {
		name string
		rl   corev1.ResourceList
	}{{"kubeReserved", c.KubeReserved}, {"systemReserved", c.SystemReserved}} {
		if f.rl == nil {
			continue
		}
		fmt.Fprintf(&b, ";%s=", f.name)
		names := make([]string, 0, len(f.rl))
		for n := range f.rl {
			names = append(names, string(n))
		}
		sort.Strings(names)
		for _, n := range names {
			q := f.rl[corev1.ResourceName(n)]
			fmt.Fprintf(&b, "%s:%s,", n, q.String())
		}
	}
	if c.EvictionHard != nil {
		b.WriteString(";evictionHard=")
		for _, s := range sortedKeys(c.EvictionHard) {
			fmt.Fprintf(&b, "%s<%s,", s, c.EvictionHard[s])
		}
	}
	return b.String()
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
