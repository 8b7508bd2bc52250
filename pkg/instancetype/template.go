package instancetype

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/capacity"
	"github.com/autonode/karpenter-clusterapi/pkg/kubelet"
)

// TemplateOptions says where the nodes of an infrastructure template can run
// in Machine mode.
type TemplateOptions struct {
	// ClusterName is the Cluster the Machines join.
	ClusterName string
	// Zones are the Cluster's failure domains; none means one offering
	// without a zone.
	Zones []string
	// SpotCapable is true when a Machine cloned from the template can be
	// made a spot instance (CAPA: spec.spotMarketOptions on the clone).
	SpotCapable bool
	// NodeLabels are added to every node (the NodeClass's Machine labels
	// that Cluster API propagates to Nodes).
	NodeLabels map[string]string
	// Kubelet is the kubelet configuration the bootstrap gives the nodes
	// (layer a NodeClass's spec.kubelet with Source.WithKubelet).
	Kubelet kubelet.Config
}

// FromTemplate computes the Sources of one infrastructure template in
// Machine mode: one per zone and capacity type. A template that asks for
// spot itself offers spot only; otherwise it offers on-demand, and spot too
// when it is spot-capable and carries a spot price annotation.
//
// Every Source shares the template's shape; an unusable template yields one
// Source with Err set, so the problem is reported once.
func FromTemplate(t *unstructured.Unstructured, o TemplateOptions) []Source {
	base := Source{
		Origin:       types.NamespacedName{Namespace: t.GetNamespace(), Name: t.GetName()},
		ClusterName:  o.ClusterName,
		ObjectLabels: t.GetLabels(),
		Available:    true,
		AWS:          isAWSTemplate(t),
		ImageID:      templateImageID(t),
	}
	what := fmt.Sprintf("%s %s/%s", t.GetKind(), t.GetNamespace(), t.GetName())
	problem := func(format string, args ...any) {
		base.Problems = append(base.Problems, what+": "+fmt.Sprintf(format, args...))
	}
	ann := t.GetAnnotations()
	parsed, errs := capacity.Parse(ann)
	var fatal []string
	for _, e := range errs {
		fatal = append(fatal, e.Error())
	}

	base.NodeLabels = map[string]string{}
	for k, v := range o.NodeLabels {
		base.NodeLabels[k] = v
	}
	for k, v := range parsed.Labels {
		base.NodeLabels[k] = v
	}

	base.Capacity = templateStatusCapacity(t, problem)
	for k, v := range parsed.Resources {
		base.Capacity[k] = v
	}
	base.Kubelet = o.Kubelet

	base.Name = base.NodeLabels[corev1.LabelInstanceTypeStable]
	if base.Name == "" {
		base.Name, _, _ = unstructured.NestedString(t.Object, "spec", "template", "spec", "instanceType")
	}
	base.Arch, base.OS = templateNodeInfo(t)
	if v := base.NodeLabels[corev1.LabelArchStable]; v != "" {
		base.Arch = v
	}
	if v := base.NodeLabels[corev1.LabelOSStable]; v != "" {
		base.OS = v
	}
	base.Taints = append(base.Taints, parsed.Taints...)

	// A template naming a capacity reservation offers it as reserved
	// capacity, in the reservation's zone; its on-demand (and spot)
	// offerings launch clones without the reservation, where Karpenter falls
	// back to when the reservation is full.
	res, reserved, err := templateReservation(t, ann)
	var resZones []string
	if err == nil && reserved {
		resZones, err = reservedZones(res, o.Zones)
	}
	if err != nil {
		fatal = append(fatal, err.Error())
	}

	switch {
	case len(fatal) > 0:
		base.Err = fmt.Errorf("%s is skipped: %s", what, strings.Join(fatal, "; "))
	case base.Name == "":
		base.Err = fmt.Errorf("%s: cannot tell the instance type its nodes will have: set spec.template.spec.instanceType, or the label %s in the annotation %s",
			what, corev1.LabelInstanceTypeStable, capacity.LabelsKey)
	case base.Capacity.Cpu().IsZero() || base.Capacity.Memory().IsZero():
		base.Err = fmt.Errorf("%s: unknown capacity: set status.capacity, or the annotations %s and %s",
			what, capacity.CPUKey, capacity.MemoryKey)
	}
	if base.Err != nil {
		return []Source{base}
	}

	capacityTypes := []string{karpv1.CapacityTypeOnDemand}
	switch {
	case templateAsksForSpot(t):
		capacityTypes = []string{karpv1.CapacityTypeSpot}
	case o.SpotCapable && hasSpotPrice(ann) && !templateIsCapacityBlock(t):
		capacityTypes = append(capacityTypes, karpv1.CapacityTypeSpot)
	}
	zones := o.Zones
	if len(zones) == 0 {
		zones = []string{""}
	}
	out := make([]Source, 0, len(zones)*len(capacityTypes))
	for _, zone := range zones {
		for _, ct := range capacityTypes {
			s := base
			s.Zone, s.CapacityType = zone, ct
			s.Capacity = base.Capacity.DeepCopy()
			s.Problems = nil
			s.Price, s.PriceEstimated = price(nil, ann, s, func(format string, args ...any) {
				s.Problems = append(s.Problems, what+": "+fmt.Sprintf(format, args...))
			})
			s.finish()
			out = append(out, s)
		}
	}
	for _, zone := range resZonesOrNone(resZones, reserved) {
		s := base
		s.Zone, s.CapacityType = zone, karpv1.CapacityTypeOnDemand
		s.Capacity = base.Capacity.DeepCopy()
		s.Problems = nil
		report := func(format string, args ...any) {
			s.Problems = append(s.Problems, what+": "+fmt.Sprintf(format, args...))
		}
		onDemand, estimated := price(nil, ann, s, report)
		s.CapacityType = karpv1.CapacityTypeReserved
		s.Price, s.PriceEstimated = reservedPrice(onDemand, report, ann), estimated
		s.ReservationID, s.ReservationCount, s.ReservationCapacity = res.ID, res.Count, res.Count
		s.finish()
		out = append(out, s)
	}
	// Report the shape's problems once, with the first offering.
	out[0].Problems = append(base.Problems, out[0].Problems...)
	return out
}

// templateStatusCapacity reads an infrastructure template's status.capacity.
func templateStatusCapacity(t *unstructured.Unstructured, problem func(string, ...any)) corev1.ResourceList {
	out := corev1.ResourceList{}
	c, ok, _ := unstructured.NestedStringMap(t.Object, "status", "capacity")
	if !ok {
		return out
	}
	for k, v := range c {
		q, err := resource.ParseQuantity(v)
		if err != nil || q.Sign() < 0 {
			problem("status.capacity[%s] %q is not a quantity", k, v)
			continue
		}
		out[corev1.ResourceName(k)] = q
	}
	return out
}

// templateNodeInfo reads status.nodeInfo, defaulting to linux/amd64.
func templateNodeInfo(t *unstructured.Unstructured) (arch, os string) {
	arch, os = "amd64", "linux"
	if v, _, _ := unstructured.NestedString(t.Object, "status", "nodeInfo", "architecture"); v != "" {
		arch = v
	}
	if v, _, _ := unstructured.NestedString(t.Object, "status", "nodeInfo", "operatingSystem"); v != "" {
		os = v
	}
	return arch, os
}

// hasSpotPrice reports a spot price annotation, for any zone or all.
func hasSpotPrice(ann map[string]string) bool {
	for k := range ann {
		if k == v1alpha1.SpotPriceAnnotation || strings.HasPrefix(k, v1alpha1.SpotPriceAnnotation+".") {
			return true
		}
	}
	return false
}

// TemplateAsksForSpot reports whether an infrastructure template launches
// spot instances by itself.
func TemplateAsksForSpot(t *unstructured.Unstructured) bool { return templateAsksForSpot(t) }

// PropagatesToNode reports whether Cluster API syncs a Machine label with
// this key to its Node.
func PropagatesToNode(key string) bool { return propagatesToNode(key) }

// resZonesOrNone: the zones of a reservation's offerings; a reservation in a
// Cluster without failure domains has one offering without a zone.
func resZonesOrNone(zones []string, reserved bool) []string {
	switch {
	case !reserved:
		return nil
	case len(zones) == 0:
		return []string{""}
	default:
		return zones
	}
}
