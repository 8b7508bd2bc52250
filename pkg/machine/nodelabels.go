package machine

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// Registration labels: a cloud provider hands the NodeClaim's labels to the
// kubelet (--node-labels), so the Node is created with them, as Karpenter
// expects (an admission policy or a scheduler sees them from the Node's
// first write). In Machine mode each Machine has a bootstrap config of its
// own, cloned from the NodeClass's bootstrap template; when that config is
// Cluster API's KubeadmConfig, the clone carries the labels in the kubelet's
// node-labels argument. A bootstrap data Secret is shared by every Machine
// and other bootstrap providers have no common field for it: those Nodes
// get the labels from Karpenter right after registration, as before.

// kubeadmBootstrapGroup is Cluster API's kubeadm bootstrap provider's API group.
const kubeadmBootstrapGroup = "bootstrap.cluster.x-k8s.io"

// kubeletLabelKeys are the labels in the kubernetes.io and k8s.io
// namespaces a kubelet may register its Node with (it refuses to start with
// any other label of those namespaces, and the NodeRestriction admission
// plugin refuses them), besides the node.kubernetes.io and
// kubelet.kubernetes.io namespaces.
var kubeletLabelKeys = map[string]bool{
	corev1.LabelTopologyZone:            true,
	corev1.LabelTopologyRegion:          true,
	corev1.LabelFailureDomainBetaZone:   true,
	corev1.LabelFailureDomainBetaRegion: true,
	corev1.LabelInstanceType:            true,
	corev1.LabelInstanceTypeStable:      true,
	corev1.LabelOSStable:                true,
	corev1.LabelArchStable:              true,
	"beta.kubernetes.io/os":             true,
	"beta.kubernetes.io/arch":           true,
}

// kubeletMaySet reports whether a kubelet may register its Node with the
// label. The hostname is the kubelet's own.
func kubeletMaySet(key string) bool {
	if key == corev1.LabelHostname {
		return false
	}
	ns, _, ok := strings.Cut(key, "/")
	if !ok {
		return true
	}
	inDomain := func(d string) bool { return ns == d || strings.HasSuffix(ns, "."+d) }
	if !inDomain("kubernetes.io") && !inDomain("k8s.io") {
		return true
	}
	return inDomain("node.kubernetes.io") || inDomain("kubelet.kubernetes.io") || kubeletLabelKeys[key]
}

// RegistrationLabels are the labels a Machine's kubelet registers its Node
// with: the NodeClaim's, and its offering's instance type, zone and
// capacity type; only those a kubelet may set.
func RegistrationLabels(claimLabels map[string]string, instanceType string, offering Offering) map[string]string {
	out := map[string]string{}
	for k, v := range claimLabels {
		if kubeletMaySet(k) {
			out[k] = v
		}
	}
	if instanceType != "" {
		out[corev1.LabelInstanceTypeStable] = instanceType
	}
	if offering.Zone != "" {
		out[corev1.LabelTopologyZone] = offering.Zone
	}
	if offering.CapacityType != "" {
		out[karpv1.CapacityTypeLabelKey] = offering.CapacityType
	}
	return out
}

// addNodeLabels puts labels into a cloned bootstrap config's kubelet
// node-labels argument when the config is a KubeadmConfig; a label of the
// template's own argument keeps its place and takes the NodeClaim's value.
// It reports whether the config is one it knows.
func addNodeLabels(config *unstructured.Unstructured, gvk schema.GroupVersionKind, labels map[string]string) (bool, error) {
	if gvk.Group != kubeadmBootstrapGroup || config.GetKind() != "KubeadmConfig" || len(labels) == 0 {
		return false, nil
	}
	path := []string{"spec", "joinConfiguration", "nodeRegistration", "kubeletExtraArgs"}
	if gvk.Version == "v1beta1" { // a map of flag names to values
		args, _, err := unstructured.NestedStringMap(config.Object, path...)
		if err != nil {
			return false, fmt.Errorf("%s: %w", strings.Join(path, "."), err)
		}
		if args == nil {
			args = map[string]string{}
		}
		args["node-labels"] = mergeNodeLabels(args["node-labels"], labels)
		return true, unstructured.SetNestedStringMap(config.Object, args, path...)
	}
	// v1beta2 and later: a list of {name, value}, in order.
	args, _, err := unstructured.NestedSlice(config.Object, path...)
	if err != nil {
		return false, fmt.Errorf("%s: %w", strings.Join(path, "."), err)
	}
	found := false
	for i, a := range args {
		arg, ok := a.(map[string]any)
		if !ok || arg["name"] != "node-labels" {
			continue
		}
		existing, _ := arg["value"].(string)
		arg["value"] = mergeNodeLabels(existing, labels)
		args[i] = arg
		found = true
	}
	if !found {
		args = append(args, map[string]any{"name": "node-labels", "value": mergeNodeLabels("", labels)})
	}
	return true, unstructured.SetNestedSlice(config.Object, args, path...)
}

// mergeNodeLabels merges labels into a node-labels value ("k1=v1,k2=v2"):
// existing keys keep their order and take the new value, new keys follow,
// sorted.
func mergeNodeLabels(existing string, labels map[string]string) string {
	var parts []string
	seen := map[string]bool{}
	for _, kv := range strings.Split(existing, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, _, _ := strings.Cut(kv, "=")
		if v, ok := labels[k]; ok {
			kv = k + "=" + v
			seen[k] = true
		}
		parts = append(parts, kv)
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		if !seen[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		parts = append(parts, k+"="+labels[k])
	}
	return strings.Join(parts, ",")
}
