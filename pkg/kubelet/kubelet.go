// Package kubelet computes what a node's kubelet keeps back from its
// capacity (kube-reserved, system-reserved, the hard eviction threshold) and
// its pod limit, from kubelet settings written by users: the flags of a
// bootstrap template (kubeletExtraArgs) or a NodeClass's kubelet block.
package kubelet

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/annotation"
)

// The kubelet flags this package reads.
const (
	FlagMaxPods        = "max-pods"
	FlagKubeReserved   = "kube-reserved"
	FlagSystemReserved = "system-reserved"
	FlagEvictionHard   = "eviction-hard"
)

// Kubelet defaults (the kubelet's own, not a cloud's): 110 pods, nothing
// reserved, hard eviction at memory.available<100Mi and nodefs.available<10%.
const DefaultMaxPods = 110

// DefaultEvictionHard are the kubelet's default hard eviction thresholds
// that reduce allocatable (its imagefs and inode thresholds do not).
var DefaultEvictionHard = map[string]string{"memory.available": "100Mi", "nodefs.available": "10%"}

// Config is the part of a kubelet configuration that decides allocatable.
// Nil and empty fields are unset, so that configurations can be layered.
type Config struct {
	MaxPods        *int64
	KubeReserved   corev1.ResourceList
	SystemReserved corev1.ResourceList
	// EvictionHard maps signals (memory.available, nodefs.available, ...) to
	// thresholds: a quantity ("100Mi") or a percentage of capacity ("5%").
	EvictionHard map[string]string
}

// Merge returns c with every unset field taken from lower.
func (c Config) Merge(lower Config) Config {
	if c.MaxPods == nil {
		c.MaxPods = lower.MaxPods
	}
	if c.KubeReserved == nil {
		c.KubeReserved = lower.KubeReserved
	}
	if c.SystemReserved == nil {
		c.SystemReserved = lower.SystemReserved
	}
	if c.EvictionHard == nil {
		c.EvictionHard = lower.EvictionHard
	}
	return c
}

// ParseFlags reads kubelet flags (name without dashes -> value). Bad values
// are skipped and reported with the flag named; where is prepended to the
// key of each error (e.g. "KubeadmConfigTemplate ns/workers kubeletExtraArgs").
func ParseFlags(where string, flags map[string]string) (Config, []*annotation.FieldError) {
	var cfg Config
	var errs []*annotation.FieldError
	key := func(flag string) string { return where + " " + flag }
	if v, ok := flags[FlagMaxPods]; ok {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < 1 || n > 1_000_000 {
			errs = append(errs, annotation.Errorf(key(FlagMaxPods), v, "is not a pod count between 1 and 1000000"))
		} else {
			cfg.MaxPods = &n
		}
	}
	for _, f := range []struct {
		flag string
		into *corev1.ResourceList
	}{{FlagKubeReserved, &cfg.KubeReserved}, {FlagSystemReserved, &cfg.SystemReserved}} {
		v, ok := flags[f.flag]
		if !ok {
			continue
		}
		rl, err := ParseReserved(key(f.flag), v)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		*f.into = rl
	}
	if v, ok := flags[FlagEvictionHard]; ok {
		m, err := ParseEviction(key(FlagEvictionHard), v)
		if err != nil {
			errs = append(errs, err)
		} else {
			cfg.EvictionHard = m
		}
	}
	return cfg, errs
}

// ParseReserved parses "cpu=100m,memory=1Gi,ephemeral-storage=1Gi,pid=100":
// non-negative quantities of known resources.
func ParseReserved(key, value string) (corev1.ResourceList, *annotation.FieldError) {
	out := corev1.ResourceList{}
	for _, item := range strings.Split(value, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, q, ok := strings.Cut(item, "=")
		name, q = strings.TrimSpace(name), strings.TrimSpace(q)
		if !ok || name == "" {
			return nil, annotation.Errorf(key, value, "is not a list of resource=quantity: item %s", annotation.Quote(item))
		}
		quantity, err := parseReservation(name, q)
		if err != nil {
			return nil, annotation.Errorf(key, value, "%v", err)
		}
		out[corev1.ResourceName(name)] = quantity
	}
	return out, nil
}

// parseReservation checks one resource=quantity of a reservation.
func parseReservation(name, q string) (resource.Quantity, error) {
	switch corev1.ResourceName(name) {
	case corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage, "pid":
	default:
		return resource.Quantity{}, fmt.Errorf("reserves %s: only cpu, memory, ephemeral-storage and pid can be reserved", annotation.Quote(name))
	}
	quantity, err := parseQuantity(q)
	if err != nil {
		return resource.Quantity{}, fmt.Errorf("has a bad quantity for %s: %v", name, err)
	}
	return quantity, nil
}

// ParseEviction parses "memory.available<100Mi,nodefs.available<10%".
func ParseEviction(key, value string) (map[string]string, *annotation.FieldError) {
	out := map[string]string{}
	for _, item := range strings.Split(value, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		signal, threshold, ok := strings.Cut(item, "<")
		signal, threshold = strings.TrimSpace(signal), strings.TrimSpace(threshold)
		if !ok || signal == "" || threshold == "" {
			return nil, annotation.Errorf(key, value, "is not a list of signal<threshold: item %s", annotation.Quote(item))
		}
		if !knownSignal(signal) {
			return nil, annotation.Errorf(key, value, "has signal %s: the kubelet knows %s", annotation.Quote(signal), strings.Join(EvictionSignals, ", "))
		}
		if err := checkThreshold(signal, threshold); err != nil {
			return nil, annotation.Errorf(key, value, "%v", err)
		}
		out[signal] = threshold
	}
	return out, nil
}

// EvictionSignals are the hard eviction signals the kubelet accepts.
var EvictionSignals = []string{"memory.available", "nodefs.available", "nodefs.inodesFree", "imagefs.available", "imagefs.inodesFree", "pid.available"}

func knownSignal(s string) bool {
	for _, k := range EvictionSignals {
		if s == k {
			return true
		}
	}
	return false
}

// checkThreshold checks one eviction threshold: a quantity or a percentage.
func checkThreshold(signal, threshold string) error {
	if pct, isPct := strings.CutSuffix(threshold, "%"); isPct {
		f, err := strconv.ParseFloat(pct, 64)
		if err != nil || math.IsNaN(f) || f < 0 || f > 100 {
			return fmt.Errorf("has a bad percentage for %s", signal)
		}
		return nil
	}
	if _, err := parseQuantity(threshold); err != nil {
		return fmt.Errorf("has a bad threshold for %s: %v", signal, err)
	}
	return nil
}

func parseQuantity(s string) (resource.Quantity, error) {
	if len(s) > 64 {
		return resource.Quantity{}, fmt.Errorf("too long")
	}
	// Reject exponents before resource.ParseQuantity sees them: huge ones
	// take it minutes.
	if strings.ContainsAny(s, "eE") && !strings.HasSuffix(s, "E") && !strings.HasSuffix(s, "Ei") {
		return resource.Quantity{}, fmt.Errorf("exponents are not accepted")
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return resource.Quantity{}, err
	}
	if q.Sign() < 0 {
		return resource.Quantity{}, fmt.Errorf("negative")
	}
	return q, nil
}

// Overhead turns a configuration into Karpenter's overhead for a node of
// the given capacity. Unset values are the kubelet's defaults.
func (c Config) Overhead(capacity corev1.ResourceList) *cloudprovider.InstanceTypeOverhead {
	eviction := corev1.ResourceList{}
	thresholds := c.EvictionHard
	if thresholds == nil {
		thresholds = DefaultEvictionHard
	}
	signals := make([]string, 0, len(thresholds))
	for s := range thresholds {
		signals = append(signals, s)
	}
	sort.Strings(signals)
	for _, signal := range signals {
		var res corev1.ResourceName
		switch signal {
		case "memory.available":
			res = corev1.ResourceMemory
		case "nodefs.available":
			res = corev1.ResourceEphemeralStorage
		default:
			continue // other signals do not reduce allocatable
		}
		eviction[res] = threshold(thresholds[signal], capacity[res])
	}
	return &cloudprovider.InstanceTypeOverhead{
		KubeReserved:      filterAllocatable(c.KubeReserved),
		SystemReserved:    filterAllocatable(c.SystemReserved),
		EvictionThreshold: eviction,
	}
}

// Pods is the pod limit: MaxPods, else the kubelet's default.
func (c Config) Pods() int64 {
	if c.MaxPods != nil {
		return *c.MaxPods
	}
	return DefaultMaxPods
}

func threshold(v string, capacity resource.Quantity) resource.Quantity {
	if pct, ok := strings.CutSuffix(v, "%"); ok {
		f, _ := strconv.ParseFloat(pct, 64)
		return *resource.NewQuantity(int64(math.Ceil(float64(capacity.Value())*f/100)), resource.BinarySI)
	}
	q, err := parseQuantity(v)
	if err != nil {
		return resource.Quantity{}
	}
	return q
}

// filterAllocatable drops reservations that do not reduce allocatable (pid).
func filterAllocatable(rl corev1.ResourceList) corev1.ResourceList {
	out := corev1.ResourceList{}
	for k, v := range rl {
		if k != "pid" {
			out[k] = v
		}
	}
	return out
}
