package machine

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

func TestOfferingRoundTripsAndRejectsMalformedValues(t *testing.T) {
	for _, o := range []Offering{
		{Template: types.NamespacedName{Namespace: "ns", Name: "t"}, Zone: "us-east-1a", CapacityType: "spot"},
		{Template: types.NamespacedName{Namespace: "ns", Name: "t"}, Zone: "", CapacityType: "on-demand"},
	} {
		got, err := ParseOffering(o.String())
		if err != nil || got != o {
			t.Fatalf("ParseOffering(%q) = %v, %v; want %v", o.String(), got, err, o)
		}
	}
	for _, bad := range []string{"", "ns/t/z", "ns//z/spot", "/t/z/spot", "ns/t/z/dedicated", "ns/t/z/spot/extra"} {
		if _, err := ParseOffering(bad); err == nil {
			t.Errorf("ParseOffering(%q) accepted a malformed value", bad)
		} else if !strings.Contains(err.Error(), v1alpha1.OfferingAnnotation) {
			t.Errorf("the error for %q does not name the annotation: %v", bad, err)
		}
	}
}

func FuzzParseOffering(f *testing.F) {
	for _, s := range []string{"ns/t/us-east-1a/spot", "ns/t//on-demand", "a/b/c/d/e", "///"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o, err := ParseOffering(s)
		if err != nil {
			return
		}
		if again, err := ParseOffering(o.String()); err != nil || again != o {
			t.Fatalf("%q parsed to %v, which does not round-trip: %v %v", s, o, again, err)
		}
	})
}

func TestObjectNameIsStableAndBounded(t *testing.T) {
	if got := ObjectName("c1", "default-abcde"); got != "c1-default-abcde" {
		t.Fatalf("ObjectName = %q", got)
	}
	long := strings.Repeat("x", 300)
	a, b := ObjectName("c1", long), ObjectName("c1", long+"y")
	if len(a) > 253 || len(b) > 253 || a == b {
		t.Fatalf("long names must be bounded and distinct: %d %d equal=%v", len(a), len(b), a == b)
	}
	if a != ObjectName("c1", long) {
		t.Fatal("ObjectName is not stable")
	}
}

func TestCloneCopiesTheTemplateTheWayAMachineSetDoes(t *testing.T) {
	tmpl := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "AWSMachineTemplate",
		"metadata": map[string]any{"name": "t1", "namespace": "ns", "labels": map[string]any{v1alpha1.KarpenterMemberLabel: ""}},
		"spec": map[string]any{"template": map[string]any{
			"metadata": map[string]any{"labels": map[string]any{"team": "a"}},
			"spec":     map[string]any{"instanceType": "m5.large"},
		}},
	}}
	gvk := schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "AWSMachineTemplate"}
	o := Offering{Template: types.NamespacedName{Namespace: "ns", Name: "t1"}, Zone: "z", CapacityType: "spot"}
	infra, err := clone(tmpl, gvk, "c1-claim", "c1", "claim", o)
	if err != nil {
		t.Fatal(err)
	}
	if infra.GetKind() != "AWSMachine" || infra.GetNamespace() != "ns" || infra.GetName() != "c1-claim" {
		t.Fatalf("clone is %s %s/%s", infra.GetKind(), infra.GetNamespace(), infra.GetName())
	}
	l, a := infra.GetLabels(), infra.GetAnnotations()
	if l["team"] != "a" || l[clusterv1.ClusterNameLabel] != "c1" || l[v1alpha1.ManagedLabel] != "true" {
		t.Fatalf("labels %v", l)
	}
	if _, member := l[v1alpha1.KarpenterMemberLabel]; member {
		t.Fatal("the template's own labels must not be copied")
	}
	if a[clusterv1.TemplateClonedFromNameAnnotation] != "t1" || a[clusterv1.TemplateClonedFromGroupKindAnnotation] != "AWSMachineTemplate.infrastructure.cluster.x-k8s.io" ||
		a[v1alpha1.NodeClaimAnnotation] != "claim" || a[v1alpha1.OfferingAnnotation] != o.String() {
		t.Fatalf("annotations %v", a)
	}
	if err := makeSpot(infra); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := unstructured.NestedMap(infra.Object, "spec", "spotMarketOptions"); !ok {
		t.Fatal("a spot offering must set spec.spotMarketOptions")
	}
	// The template itself is untouched.
	if _, ok, _ := unstructured.NestedMap(tmpl.Object, "spec", "template", "spec", "spotMarketOptions"); ok {
		t.Fatal("makeSpot changed the template")
	}
}

// CAPA's AWSMachine webhook refuses spotMarketOptions beside marketType
// OnDemand or CapacityBlock: a spot clone of a template that says OnDemand
// asks for Spot; a CapacityBlock one cannot be made spot.
func TestMakeSpotKeepsTheMarketTypeCAPAAccepts(t *testing.T) {
	clone := func(marketType string) *unstructured.Unstructured {
		spec := map[string]any{"instanceType": "m5.large"}
		if marketType != "" {
			spec["marketType"] = marketType
		}
		u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
		u.SetKind("AWSMachine")
		u.SetName("m")
		return u
	}
	for _, c := range []struct{ marketType, want string }{{"", ""}, {"OnDemand", "Spot"}, {"Spot", "Spot"}} {
		infra := clone(c.marketType)
		if err := makeSpot(infra); err != nil {
			t.Fatalf("marketType %q: %v", c.marketType, err)
		}
		got, _, _ := unstructured.NestedString(infra.Object, "spec", "marketType")
		if _, ok, _ := unstructured.NestedMap(infra.Object, "spec", "spotMarketOptions"); !ok || got != c.want {
			t.Fatalf("marketType %q: got marketType %q (spotMarketOptions set %v), want %q with spotMarketOptions", c.marketType, got, ok, c.want)
		}
	}
	if err := makeSpot(clone("CapacityBlock")); err == nil {
		t.Fatal("a CapacityBlock machine was made spot")
	}
}

func TestHashesFollowWhatALaunchCopies(t *testing.T) {
	tmpl := func(it string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"metadata": map[string]any{"name": "t", "resourceVersion": it},
			"spec":     map[string]any{"template": map[string]any{"spec": map[string]any{"instanceType": it}}},
		}}
	}
	if TemplateHash(tmpl("a")) == TemplateHash(tmpl("b")) {
		t.Fatal("a changed spec.template must change the hash")
	}
	a := tmpl("a")
	b := tmpl("a")
	b.SetLabels(map[string]string{"x": "y"})
	if TemplateHash(a) != TemplateHash(b) {
		t.Fatal("metadata is not copied by a launch and must not change the hash")
	}
	secret := "s"
	mt := &v1alpha1.MachineTemplate{Bootstrap: v1alpha1.Bootstrap{DataSecretName: &secret}}
	other := "t"
	mt2 := &v1alpha1.MachineTemplate{Bootstrap: v1alpha1.Bootstrap{DataSecretName: &other}}
	if BootstrapHash(mt, nil) == BootstrapHash(mt2, nil) {
		t.Fatal("another bootstrap Secret must change the hash")
	}
}
