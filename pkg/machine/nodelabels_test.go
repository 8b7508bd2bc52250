package machine

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

func TestRegistrationLabelsKeepOnlyWhatAKubeletMaySet(t *testing.T) {
	claim := map[string]string{
		"karpenter.sh/nodepool":                  "default",
		"registration":                           "fail",
		"team":                                   "a",
		"node.kubernetes.io/instance-type":       "old",
		"node-role.kubernetes.io/worker":         "",     // a kubelet may not set roles
		"kubernetes.io/hostname":                 "h",    // the kubelet's own
		"example.k8s.io/x":                       "y",    // refused by the kubelet
		"feature.node.kubernetes.io/cpu":         "true", // node.kubernetes.io namespace
		"topology.kubernetes.io/region":          "us-east-1",
		"karpenter.k8s.aws/instance-category":    "m",
		"kubelet.kubernetes.io/managed-by-thing": "1",
	}
	got := RegistrationLabels(claim, "m5.large", Offering{Template: types.NamespacedName{Namespace: "ns", Name: "t"}, Zone: "us-east-1a", CapacityType: "spot"})
	want := map[string]string{
		"karpenter.sh/nodepool":                  "default",
		"registration":                           "fail",
		"team":                                   "a",
		"node.kubernetes.io/instance-type":       "m5.large",
		"feature.node.kubernetes.io/cpu":         "true",
		"topology.kubernetes.io/region":          "us-east-1",
		"topology.kubernetes.io/zone":            "us-east-1a",
		"karpenter.sh/capacity-type":             "spot",
		"karpenter.k8s.aws/instance-category":    "m",
		"kubelet.kubernetes.io/managed-by-thing": "1",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("RegistrationLabels = %v, want %v", got, want)
	}
	// No zone (an offering of no particular zone): no zone label.
	if z, ok := RegistrationLabels(nil, "m5.large", Offering{CapacityType: "on-demand"})["topology.kubernetes.io/zone"]; ok {
		t.Fatalf("zone label %q for an offering without a zone", z)
	}
}

func kubeadmConfig(version string, args any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetGroupVersionKind(schema.GroupVersionKind{Group: kubeadmBootstrapGroup, Version: version, Kind: "KubeadmConfig"})
	if args != nil {
		_ = unstructured.SetNestedField(u.Object, args, "spec", "joinConfiguration", "nodeRegistration", "kubeletExtraArgs")
	}
	return u
}

func TestAddNodeLabelsToAKubeadmConfig(t *testing.T) {
	gvk := schema.GroupVersionKind{Group: kubeadmBootstrapGroup, Version: "v1beta2", Kind: "KubeadmConfigTemplate"}
	labels := map[string]string{"registration": "fail", "karpenter.sh/nodepool": "default", "team": "b"}

	// A template with other arguments and a node-labels of its own (what
	// CAPA's templates and users write): kept, in order, the NodeClaim's
	// value wins for a label both name.
	c := kubeadmConfig("v1beta2", []any{
		map[string]any{"name": "kube-reserved", "value": "cpu=100m"},
		map[string]any{"name": "node-labels", "value": "team=a,tier=web"},
	})
	if ok, err := addNodeLabels(c, gvk, labels); !ok || err != nil {
		t.Fatalf("addNodeLabels = %v, %v", ok, err)
	}
	args, _, _ := unstructured.NestedSlice(c.Object, "spec", "joinConfiguration", "nodeRegistration", "kubeletExtraArgs")
	want := []any{
		map[string]any{"name": "kube-reserved", "value": "cpu=100m"},
		map[string]any{"name": "node-labels", "value": "team=b,tier=web,karpenter.sh/nodepool=default,registration=fail"},
	}
	if !reflect.DeepEqual(args, want) {
		t.Fatalf("kubeletExtraArgs = %v, want %v", args, want)
	}

	// A template without any join configuration (the simplest a user
	// writes): the argument is added.
	c = kubeadmConfig("v1beta2", nil)
	if ok, err := addNodeLabels(c, gvk, labels); !ok || err != nil {
		t.Fatalf("addNodeLabels = %v, %v", ok, err)
	}
	args, _, _ = unstructured.NestedSlice(c.Object, "spec", "joinConfiguration", "nodeRegistration", "kubeletExtraArgs")
	want = []any{map[string]any{"name": "node-labels", "value": "karpenter.sh/nodepool=default,registration=fail,team=b"}}
	if !reflect.DeepEqual(args, want) {
		t.Fatalf("kubeletExtraArgs = %v, want %v", args, want)
	}

	// v1beta1: a map.
	gvk1 := gvk
	gvk1.Version = "v1beta1"
	c = kubeadmConfig("v1beta1", map[string]any{"max-pods": "20"})
	if ok, err := addNodeLabels(c, gvk1, labels); !ok || err != nil {
		t.Fatalf("addNodeLabels v1beta1 = %v, %v", ok, err)
	}
	m, _, _ := unstructured.NestedStringMap(c.Object, "spec", "joinConfiguration", "nodeRegistration", "kubeletExtraArgs")
	if want := map[string]string{"max-pods": "20", "node-labels": "karpenter.sh/nodepool=default,registration=fail,team=b"}; !reflect.DeepEqual(m, want) {
		t.Fatalf("v1beta1 kubeletExtraArgs = %v, want %v", m, want)
	}

	// A malformed argument list names the field.
	c = kubeadmConfig("v1beta2", "not a list")
	if _, err := addNodeLabels(c, gvk, labels); err == nil {
		t.Fatal("a kubeletExtraArgs that is not a list: no error")
	}

	// Another bootstrap provider's config is left as it is.
	other := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"x": "y"}}}
	other.SetGroupVersionKind(schema.GroupVersionKind{Group: "bootstrap.cluster.x-k8s.io", Version: "v1beta2", Kind: "TalosConfig"})
	before := other.DeepCopy()
	if ok, err := addNodeLabels(other, schema.GroupVersionKind{Group: "bootstrap.cluster.x-k8s.io", Version: "v1beta2", Kind: "TalosConfigTemplate"}, labels); ok || err != nil {
		t.Fatalf("addNodeLabels on a TalosConfig = %v, %v", ok, err)
	}
	if !reflect.DeepEqual(other, before) {
		t.Fatalf("a TalosConfig was changed: %v", other.Object)
	}
}
