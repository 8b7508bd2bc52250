package instancetype

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

func md(name string, ann map[string]string, zone string, replicas int32) *clusterv1.MachineDeployment {
	return &clusterv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Annotations: ann, Labels: map[string]string{"pool": "a"}},
		Spec: clusterv1.MachineDeploymentSpec{
			ClusterName: "c1",
			Replicas:    &replicas,
			Template: clusterv1.MachineTemplateSpec{Spec: clusterv1.MachineSpec{
				FailureDomain:     zone,
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "AWSMachineTemplate", Name: name},
			}},
		},
	}
}

func awsTemplate(instanceType string, spot bool, capacity map[string]any, ann map[string]string) *unstructured.Unstructured {
	spec := map[string]any{"instanceType": instanceType}
	if spot {
		spec["spotMarketOptions"] = map[string]any{}
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "AWSMachineTemplate",
		"metadata": map[string]any{"name": "t", "namespace": "ns"},
		"spec":     map[string]any{"template": map[string]any{"spec": spec}},
		"status":   map[string]any{"capacity": capacity, "nodeInfo": map[string]any{"architecture": "arm64", "operatingSystem": "linux"}},
	}}
	u.SetAnnotations(ann)
	return u
}

func TestFromMachineDeploymentReadsTemplateAndAnnotations(t *testing.T) {
	tmpl := awsTemplate("m6g.large", true, map[string]any{"cpu": "2", "memory": "8Gi"}, map[string]string{v1alpha1.SpotPriceAnnotation: "0.031"})
	src := FromMachineDeployment(md("a", map[string]string{"capacity.cluster-autoscaler.kubernetes.io/maxPods": "58"}, "us-east-1a", 0), tmpl)
	if src.Err != nil || len(src.Problems) > 0 {
		t.Fatalf("unexpected errors: %v %v", src.Err, src.Problems)
	}
	if src.Name != "m6g.large" || src.Arch != "arm64" || src.Zone != "us-east-1a" || src.CapacityType != karpv1.CapacityTypeSpot {
		t.Fatalf("got name=%s arch=%s zone=%s ct=%s", src.Name, src.Arch, src.Zone, src.CapacityType)
	}
	if src.Price != 0.031 || src.PriceEstimated {
		t.Fatalf("want the template's spot price 0.031, got %v (estimated=%v)", src.Price, src.PriceEstimated)
	}
	if src.Capacity.Pods().Value() != 58 || src.Capacity.Memory().Cmp(resource.MustParse("8Gi")) != 0 {
		t.Fatalf("capacity = %v", src.Capacity)
	}
}

func TestMalformedCapacityAnnotationsSkipTheMachineDeployment(t *testing.T) {
	tmpl := awsTemplate("m5.large", false, map[string]any{"cpu": "2", "memory": "8Gi"}, nil)
	src := FromMachineDeployment(md("a", map[string]string{
		"capacity.cluster-autoscaler.kubernetes.io/cpu":    "lots",
		"capacity.cluster-autoscaler.kubernetes.io/taints": "x",
	}, "", 0), tmpl)
	if src.Err == nil {
		t.Fatal("a MachineDeployment whose node shape is unknown must be skipped")
	}
	for _, want := range []string{"MachineDeployment ns/a", "capacity.cluster-autoscaler.kubernetes.io/cpu", `"lots"`, "capacity.cluster-autoscaler.kubernetes.io/taints", `"x"`} {
		if !strings.Contains(src.Err.Error(), want) {
			t.Errorf("error does not mention %s: %v", want, src.Err)
		}
	}
	if set := Build([]Source{src}); len(set.InstanceTypes) != 0 || len(set.Problems) == 0 {
		t.Fatalf("skipped source must yield no instance type and a problem, got %d types, problems %v", len(set.InstanceTypes), set.Problems)
	}
}

func TestAnnotationsWinOverTemplateAndBadPriceFallsBackToEstimate(t *testing.T) {
	tmpl := awsTemplate("m5.large", false, map[string]any{"cpu": "2", "memory": "8Gi"}, nil)
	src := FromMachineDeployment(md("a", map[string]string{
		"capacity.cluster-autoscaler.kubernetes.io/memory": "16Gi",
		v1alpha1.PriceAnnotation:                           "free",
	}, "", 0), tmpl)
	if src.Err != nil {
		t.Fatal(src.Err)
	}
	if src.Capacity.Cpu().Cmp(resource.MustParse("2")) != 0 || src.Capacity.Memory().Cmp(resource.MustParse("16Gi")) != 0 {
		t.Fatalf("want cpu 2 from the template and memory 16Gi from the annotation, got %v", src.Capacity)
	}
	joined := strings.Join(src.Problems, "\n")
	for _, want := range []string{"MachineDeployment ns/a", v1alpha1.PriceAnnotation, `"free"`} {
		if !strings.Contains(joined, want) {
			t.Errorf("problems do not mention %s:\n%s", want, joined)
		}
	}
	if !src.PriceEstimated || src.Price <= 0 {
		t.Fatalf("a bad price falls back to a positive estimate, got %v estimated=%v", src.Price, src.PriceEstimated)
	}
}

func TestFromMachineDeploymentUnusableWithoutNameOrCapacity(t *testing.T) {
	src := FromMachineDeployment(md("a", nil, "", 0), nil)
	if src.Err == nil || !strings.Contains(src.Err.Error(), "instance type") {
		t.Fatalf("want an error about the instance type, got %v", src.Err)
	}
	src = FromMachineDeployment(md("b", map[string]string{"capacity.cluster-autoscaler.kubernetes.io/labels": "node.kubernetes.io/instance-type=x1"}, "", 0), nil)
	if src.Err == nil || !strings.Contains(src.Err.Error(), "capacity") {
		t.Fatalf("want an error about capacity, got %v", src.Err)
	}
}

func TestMaxSizeMakesOfferingUnavailable(t *testing.T) {
	tmpl := awsTemplate("m5.large", false, map[string]any{"cpu": "2", "memory": "8Gi"}, nil)
	full := FromMachineDeployment(md("full", map[string]string{MaxSizeAnnotation: "3"}, "us-east-1a", 3), tmpl)
	room := FromMachineDeployment(md("room", map[string]string{MaxSizeAnnotation: "3"}, "us-east-1a", 2), tmpl)
	if full.Available || !room.Available {
		t.Fatalf("available: full=%v room=%v", full.Available, room.Available)
	}
	set := Build([]Source{full})
	if len(set.InstanceTypes) != 1 || set.InstanceTypes[0].Offerings[0].Available {
		t.Fatalf("a full MachineDeployment's type must still be returned, unavailable: %+v", set.InstanceTypes)
	}
}

func TestBuildMergesSameInstanceTypeIntoOfferings(t *testing.T) {
	tmpl := awsTemplate("m5.large", false, map[string]any{"cpu": "2", "memory": "8Gi"}, nil)
	spotTmpl := awsTemplate("m5.large", true, map[string]any{"cpu": "2", "memory": "8Gi"}, nil)
	a := FromMachineDeployment(md("a", map[string]string{v1alpha1.PriceAnnotation: "0.096"}, "us-east-1a", 0), tmpl)
	b := FromMachineDeployment(md("b", map[string]string{v1alpha1.PriceAnnotation: "0.097"}, "us-east-1b", 0), tmpl)
	s := FromMachineDeployment(md("s", map[string]string{v1alpha1.SpotPriceAnnotation: "0.04"}, "us-east-1a", 0), spotTmpl)
	set := Build([]Source{b, s, a})
	if len(set.InstanceTypes) != 1 {
		t.Fatalf("want one instance type, got %d", len(set.InstanceTypes))
	}
	it := set.InstanceTypes[0]
	if len(it.Offerings) != 3 {
		t.Fatalf("want 3 offerings (2 zones on-demand + spot), got %d", len(it.Offerings))
	}
	price, ok := it.OfferingPrice("us-east-1a", karpv1.CapacityTypeSpot)
	if !ok || price != 0.04 {
		t.Fatalf("spot offering price = %v %v", price, ok)
	}
	origin := set.Origins[OfferingKey{InstanceType: "m5.large", Zone: "us-east-1b", CapacityType: karpv1.CapacityTypeOnDemand}]
	if len(origin) != 1 || origin[0].Origin.Name != "b" {
		t.Fatalf("offering us-east-1b must launch from MachineDeployment b, got %+v", origin)
	}
	if !it.Requirements.Get(corev1.LabelTopologyZone).Has("us-east-1b") {
		t.Fatal("zone requirement misses us-east-1b")
	}
}

func TestDefaultAllocatableIsTheKubeletsOwn(t *testing.T) {
	src := FromMachineDeployment(md("a", nil, "", 0), awsTemplate("m5.large", false, map[string]any{"cpu": "2", "memory": "8Gi"}, nil))
	if src.Err != nil {
		t.Fatal(src.Err)
	}
	want := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("8092Mi"), corev1.ResourcePods: resource.MustParse("110")}
	if !equalResources(src.Allocatable, want) {
		t.Fatalf("allocatable = %v, want %v (nothing reserved, 100Mi eviction, 110 pods)", src.Allocatable, want)
	}
}

func TestReplicaChangesKeepTheMemoUnlessAMaxSizeIsSet(t *testing.T) {
	tmpl := awsTemplate("m5.large", false, map[string]any{"cpu": "2", "memory": "8Gi"}, nil)
	store := NewStore()
	sel := labels.Everything()
	store.Put(FromMachineDeployment(md("a", nil, "us-east-1a", 0), tmpl))
	first := store.Resolve(sel, "all")
	store.Put(FromMachineDeployment(md("a", nil, "us-east-1a", 7), tmpl))
	if store.Resolve(sel, "all") != first {
		t.Fatal("a replica change without a max size rebuilt the instance types")
	}
	store.Put(FromMachineDeployment(md("a", map[string]string{MaxSizeAnnotation: "7"}, "us-east-1a", 7), tmpl))
	if set := store.Resolve(sel, "all"); set == first || set.InstanceTypes[0].Offerings[0].Available {
		t.Fatal("reaching the max size must rebuild and make the offering unavailable")
	}
}

func TestStoreKeepsAnUnusableSourceWithoutPanicking(t *testing.T) {
	bad := map[string]string{"capacity.cluster-autoscaler.kubernetes.io/cpu": "two"}
	s := NewStore()
	changes := s.Subscribe()
	s.Put(FromMachineDeployment(md("bad", bad, "us-east-1a", 0), nil))
	<-changes
	// The same unusable MachineDeployment again (a resync): no change, no panic.
	s.Put(FromMachineDeployment(md("bad", bad, "us-east-1a", 0), nil))
	select {
	case <-changes:
		t.Fatal("an unchanged unusable source must not signal a change")
	default:
	}
	// Another error message is a change.
	s.Put(FromMachineDeployment(md("bad", map[string]string{"capacity.cluster-autoscaler.kubernetes.io/cpu": "three"}, "us-east-1a", 0), nil))
	select {
	case <-changes:
	default:
		t.Fatal("a new error must signal a change")
	}
}

// Each listener (the NodeClass status controller, the NodeOverlay refresh)
// gets every change: one reading its signal does not take it from another.
func TestStoreSignalsEveryListener(t *testing.T) {
	s := NewStore()
	a, b := s.Subscribe(), s.Subscribe()
	s.Put(FromMachineDeployment(md("one", nil, "us-east-1a", 0), nil))
	s.Put(FromMachineDeployment(md("two", nil, "us-east-1a", 0), nil))
	for name, ch := range map[string]<-chan struct{}{"first": a, "second": b} {
		select {
		case <-ch:
		default:
			t.Fatalf("the %s listener was not told of the change", name)
		}
		select {
		case <-ch:
			t.Fatalf("the %s listener got two signals for changes it had not read yet; one covers both", name)
		default:
		}
	}
	s.Notify()
	for name, ch := range map[string]<-chan struct{}{"first": a, "second": b} {
		select {
		case <-ch:
		default:
			t.Fatalf("Notify did not reach the %s listener", name)
		}
	}
}
