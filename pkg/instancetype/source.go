// Package instancetype turns Cluster API objects (MachineDeployments and
// infrastructure templates) into Karpenter instance types and offerings.
package instancetype

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/capacity"
	"github.com/autonode/karpenter-clusterapi/pkg/kubelet"
	"github.com/autonode/karpenter-clusterapi/pkg/pricing"
)

// Annotations Cluster API's autoscaler integration uses for node group sizes.
const (
	MinSizeAnnotation = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"
	MaxSizeAnnotation = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"
)

// DefaultMaxPods is the kubelet's default pod limit.
const DefaultMaxPods = 110

// Source is what one MachineDeployment (or one template in one zone and
// capacity type) yields: one offering of one instance type.
type Source struct {
	// Origin is the object the offering launches from.
	Origin types.NamespacedName
	// ClusterName of the origin.
	ClusterName string
	// ObjectLabels are the origin's own labels, matched by NodeClass selectors.
	ObjectLabels map[string]string

	// Name of the instance type: the node.kubernetes.io/instance-type label
	// its Nodes will carry.
	Name         string
	Capacity     corev1.ResourceList
	Arch, OS     string
	NodeLabels   map[string]string
	Taints       []corev1.Taint
	Zone         string
	CapacityType string
	Price        float64
	// PriceEstimated is true when no price annotation gave the price.
	PriceEstimated bool
	// Available is false when the origin cannot grow (at its max size).
	Available bool
	// Replicas of a MachineDeployment origin that has a max size (0 otherwise).
	Replicas int32
	// ReservationID is the capacity reservation a reserved source launches
	// into; ReservationCount how many instances it holds, and
	// ReservationCapacity how many more it can take now (Count minus the
	// instances in it, set by whoever knows them).
	ReservationID       string
	ReservationCount    int
	ReservationCapacity int
	// ImageID is the machine image the template names (CAPA: spec.ami.id),
	// shown as the NodeClaim's status.imageID; "" when not known.
	ImageID string
	// AWS is true when the nodes come from an AWSMachineTemplate (CAPA): the
	// instance type also carries the AWS provider's derivable labels.
	AWS bool
	// InstanceLabels are the well-known instance labels of the type
	// (labels.go): derived from its name and capacity, or given by the
	// capacity labels annotation. finish computes them.
	InstanceLabels map[string]string

	// Kubelet is the kubelet configuration of the origin's nodes as far as it
	// decides allocatable, highest source first: the bootstrap template's
	// kubelet arguments, then the maxPods capacity annotation; unset fields
	// are the kubelet's defaults. finish computes the pods capacity and
	// Allocatable from it; WithKubelet layers a NodeClass's spec.kubelet on top.
	Kubelet kubelet.Config

	// Labels are the labels a NodeClaim of this source carries, and
	// Allocatable its allocatable resources: computed once per change, shared
	// read-only by every NodeClaim that Get and List describe.
	Labels      map[string]string
	Allocatable corev1.ResourceList

	// Problems are bad values that were skipped; each names the object and key.
	Problems []string
	// Err is set when the origin cannot be used at all.
	Err error
}

// FromMachineDeployment computes the Source of a MachineDeployment whose
// bootstrap template is not known. template is its infrastructure template,
// or nil when it could not be read.
func FromMachineDeployment(md *clusterv1.MachineDeployment, template *unstructured.Unstructured) Source {
	return FromMachineDeploymentTemplates(md, template, nil)
}

// FromMachineDeploymentTemplates computes the Source of a MachineDeployment.
// template is its infrastructure template and bootstrap its bootstrap config
// template (spec.template.spec.bootstrap.configRef), each nil when absent or
// unreadable. The kubelet arguments of a KubeadmConfigTemplate decide the
// nodes' overhead and pod limit over the maxPods capacity annotation; bad
// ones are reported and skipped.
func FromMachineDeploymentTemplates(md *clusterv1.MachineDeployment, template, bootstrap *unstructured.Unstructured) Source {
	src := Source{
		Origin:       types.NamespacedName{Namespace: md.Namespace, Name: md.Name},
		ClusterName:  md.Spec.ClusterName,
		ObjectLabels: md.Labels,
		Available:    true,
	}
	// Replicas matter only against a max size; leaving them out otherwise
	// keeps a scale-up from invalidating every memoized instance-type set.
	if _, ok := md.Annotations[MaxSizeAnnotation]; ok && md.Spec.Replicas != nil {
		src.Replicas = *md.Spec.Replicas
	}
	what := fmt.Sprintf("MachineDeployment %s/%s", md.Namespace, md.Name)
	problem := func(format string, args ...any) {
		src.Problems = append(src.Problems, what+": "+fmt.Sprintf(format, args...))
	}

	// Scale-from-zero data: the MachineDeployment's annotations win over the template's.
	var tmplAnnotations map[string]string
	if template != nil {
		tmplAnnotations = template.GetAnnotations()
	}
	// A malformed capacity, label or taint annotation means we cannot tell
	// what nodes this MachineDeployment makes: it is not used until fixed.
	var fatal []string
	tmplCap, tmplErrs := capacity.Parse(tmplAnnotations)
	for _, e := range tmplErrs {
		fatal = append(fatal, fmt.Sprintf("infrastructure template %s: %v", template.GetName(), e))
	}
	mdCap, mdErrs := capacity.Parse(md.Annotations)
	for _, e := range mdErrs {
		fatal = append(fatal, e.Error())
	}

	src.NodeLabels = map[string]string{}
	for k, v := range md.Spec.Template.Labels {
		if propagatesToNode(k) || k == corev1.LabelInstanceTypeStable || k == corev1.LabelTopologyZone || k == karpv1.CapacityTypeLabelKey {
			src.NodeLabels[k] = v
		}
	}
	for k, v := range tmplCap.Labels {
		src.NodeLabels[k] = v
	}
	for k, v := range mdCap.Labels {
		src.NodeLabels[k] = v
	}

	// Capacity: annotations, else the template's status.capacity.
	src.Capacity = corev1.ResourceList{}
	if template != nil {
		if c, ok, _ := unstructured.NestedStringMap(template.Object, "status", "capacity"); ok {
			for k, v := range c {
				q, err := resource.ParseQuantity(v)
				if err != nil || q.Sign() < 0 {
					problem("infrastructure template %s: status.capacity[%s] %q is not a quantity", template.GetName(), k, v)
					continue
				}
				src.Capacity[corev1.ResourceName(k)] = q
			}
		}
	}
	for k, v := range tmplCap.Resources {
		src.Capacity[k] = v
	}
	for k, v := range mdCap.Resources {
		src.Capacity[k] = v
	}
	if _, ok := src.Capacity[corev1.ResourcePods]; !ok {
		src.Capacity[corev1.ResourcePods] = *resource.NewQuantity(DefaultMaxPods, resource.DecimalSI)
	}

	src.AWS = isAWSTemplate(template)
	src.ImageID = templateImageID(template)
	// Name: what the Node's instance-type label will say.
	src.Name = src.NodeLabels[corev1.LabelInstanceTypeStable]
	if src.Name == "" && template != nil {
		src.Name, _, _ = unstructured.NestedString(template.Object, "spec", "template", "spec", "instanceType")
	}

	// Architecture and OS: labels win over the template's status.nodeInfo.
	src.Arch, src.OS = "amd64", "linux"
	if template != nil {
		if v, _, _ := unstructured.NestedString(template.Object, "status", "nodeInfo", "architecture"); v != "" {
			src.Arch = v
		}
		if v, _, _ := unstructured.NestedString(template.Object, "status", "nodeInfo", "operatingSystem"); v != "" {
			src.OS = v
		}
	}
	if v := src.NodeLabels[corev1.LabelArchStable]; v != "" {
		src.Arch = v
	}
	if v := src.NodeLabels[corev1.LabelOSStable]; v != "" {
		src.OS = v
	}

	// Taints: the annotation's and the Machine template's.
	src.Taints = append(src.Taints, tmplCap.Taints...)
	src.Taints = append(src.Taints, mdCap.Taints...)
	for _, t := range md.Spec.Template.Spec.Taints {
		src.Taints = append(src.Taints, corev1.Taint{Key: t.Key, Value: t.Value, Effect: t.Effect})
	}

	// Zone: the failure domain, else the zone label.
	src.Zone = md.Spec.Template.Spec.FailureDomain
	if src.Zone == "" {
		src.Zone = src.NodeLabels[corev1.LabelTopologyZone]
	}

	src.CapacityType = karpv1.CapacityTypeOnDemand
	if template != nil && templateAsksForSpot(template) {
		src.CapacityType = karpv1.CapacityTypeSpot
	}
	// Every Machine of a MachineDeployment whose template names a capacity
	// reservation launches into it: all its replicas hold a slot.
	res, reserved, resErr := templateReservation(template, tmplAnnotations, md.Annotations)
	if resErr != nil {
		fatal = append(fatal, resErr.Error())
	} else if reserved {
		src.CapacityType = karpv1.CapacityTypeReserved
		src.ReservationID, src.ReservationCount = res.ID, res.Count
		if md.Spec.Replicas != nil {
			src.Replicas = *md.Spec.Replicas
		}
		src.ReservationCapacity = max(0, res.Count-int(src.Replicas))
		if res.Zone != "" && src.Zone != "" && res.Zone != src.Zone {
			fatal = append(fatal, fmt.Sprintf("annotation %q says zone %s, spec.template.spec.failureDomain %s", v1alpha1.ReservationZoneAnnotation, res.Zone, src.Zone))
		}
	}
	if v := src.NodeLabels[karpv1.CapacityTypeLabelKey]; v != "" {
		src.CapacityType = v
	}

	// At the max-size annotation the MachineDeployment cannot grow.
	if v, ok := md.Annotations[MaxSizeAnnotation]; ok {
		max, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
		if err != nil || max < 0 {
			fatal = append(fatal, fmt.Sprintf("annotation %q: %q is not a non-negative integer", MaxSizeAnnotation, v))
		} else if int64(src.Replicas) >= max {
			src.Available = false
		}
	}

	// A malformed min-size is not "no minimum": the provider could not
	// tell which replicas it may give back.
	if v, ok := md.Annotations[MinSizeAnnotation]; ok {
		if min, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32); err != nil || min < 0 {
			fatal = append(fatal, fmt.Sprintf("annotation %q: %q is not a non-negative integer", MinSizeAnnotation, v))
		}
	}

	// Usability.
	switch {
	case len(fatal) > 0:
		src.Err = fmt.Errorf("%s is skipped: %s", what, strings.Join(fatal, "; "))
	case src.Name == "":
		src.Err = fmt.Errorf("%s: cannot tell the instance type its nodes will have: set the label %s in the annotation %s, in spec.template.metadata.labels, or spec.template.spec.instanceType on the infrastructure template",
			what, corev1.LabelInstanceTypeStable, capacity.LabelsKey)
	case src.Capacity.Cpu().IsZero() || src.Capacity.Memory().IsZero():
		src.Err = fmt.Errorf("%s: unknown capacity: set the annotations %s and %s, or status.capacity on the infrastructure template",
			what, capacity.CPUKey, capacity.MemoryKey)
	}

	src.Kubelet = bootstrapKubelet(md, bootstrap, problem)

	src.Price, src.PriceEstimated = price(md.Annotations, tmplAnnotations, src, problem)
	if src.isReserved() {
		src.Price = reservedPrice(src.Price, problem, tmplAnnotations, md.Annotations)
	}
	if src.Err == nil {
		src.finish()
	}
	return src
}

// finish computes what NodeClaims of this source share.
func (s *Source) finish() {
	s.Labels = make(map[string]string, len(s.NodeLabels)+5)
	for k, v := range s.NodeLabels {
		s.Labels[k] = v
	}
	s.Labels[corev1.LabelInstanceTypeStable] = s.Name
	s.Labels[corev1.LabelArchStable] = s.Arch
	s.Labels[corev1.LabelOSStable] = s.OS
	s.Labels[karpv1.CapacityTypeLabelKey] = s.CapacityType
	if s.Zone != "" {
		s.Labels[corev1.LabelTopologyZone] = s.Zone
	} else {
		delete(s.Labels, corev1.LabelTopologyZone)
	}
	if s.isReserved() {
		s.Labels[v1alpha1.LabelCapacityReservationID] = s.ReservationID
	} else {
		delete(s.Labels, v1alpha1.LabelCapacityReservationID)
	}
	s.InstanceLabels = s.instanceLabels()
	for k, v := range s.InstanceLabels {
		s.Labels[k] = v
	}
	// The pod limit: the kubelet configuration's max-pods, else the pods
	// capacity the annotations gave, else the kubelet's default.
	if s.Kubelet.MaxPods == nil {
		if q, ok := s.Capacity[corev1.ResourcePods]; ok && q.Value() > 0 {
			n := q.Value()
			s.Kubelet.MaxPods = &n
		}
	}
	if s.Capacity == nil {
		s.Capacity = corev1.ResourceList{}
	}
	s.Capacity[corev1.ResourcePods] = *resource.NewQuantity(s.Kubelet.Pods(), resource.DecimalSI)
	s.Allocatable = Allocatable(s.Capacity, s.Kubelet.Overhead(s.Capacity))
}

// WithKubelet returns the source with a NodeClass's kubelet settings layered
// over its own (the fields set in override win) and what depends on them
// recomputed. The receiver is not modified.
func (s Source) WithKubelet(override kubelet.Config) Source {
	if s.Err != nil || override.Key() == "" {
		return s
	}
	s.Kubelet = override.Merge(s.Kubelet)
	s.Capacity = s.Capacity.DeepCopy()
	s.finish()
	return s
}

// bootstrapKubelet reads the kubelet settings of a MachineDeployment's
// bootstrap template when it is a KubeadmConfigTemplate.
func bootstrapKubelet(md *clusterv1.MachineDeployment, bootstrap *unstructured.Unstructured, problem func(string, ...any)) kubelet.Config {
	ref := md.Spec.Template.Spec.Bootstrap.ConfigRef
	if ref.Kind != kubelet.KubeadmConfigTemplateKind || ref.APIGroup != kubelet.KubeadmGroup {
		return kubelet.Config{}
	}
	if bootstrap == nil {
		problem("bootstrap template %s %s cannot be read: its kubelet settings are not known, the kubelet's defaults are assumed", ref.Kind, ref.Name)
		return kubelet.Config{}
	}
	cfg, errs := kubelet.FromKubeadmConfigTemplate(bootstrap)
	for _, e := range errs {
		problem("%s", kubelet.Problem(e))
	}
	return cfg
}

// price finds the offering's hourly price: the MachineDeployment's
// annotation, then the template's, then an estimate from the shape.
func price(mdAnn, tmplAnn map[string]string, src Source, problem func(string, ...any)) (float64, bool) {
	keys := []string{v1alpha1.PriceAnnotation, v1alpha1.CurrentPriceAnnotation}
	if src.CapacityType == karpv1.CapacityTypeSpot {
		keys = []string{v1alpha1.SpotPriceAnnotation}
	}
	for _, ann := range []map[string]string{mdAnn, tmplAnn} {
		for _, key := range keys {
			if src.Zone != "" {
				if v, ok := ann[key+"."+src.Zone]; ok {
					if p, err := pricing.ParsePrice(key+"."+src.Zone, v); err == nil {
						return p, false
					} else {
						problem("%v", err)
					}
				}
			}
			if v, ok := ann[key]; ok {
				if p, err := pricing.ParsePrice(key, v); err == nil {
					return p, false
				} else {
					problem("%v", err)
				}
			}
		}
	}
	est := pricing.Estimate(*src.Capacity.Cpu(), *src.Capacity.Memory(), gpuCount(src.Capacity))
	if src.CapacityType == karpv1.CapacityTypeSpot {
		est = pricing.SpotEstimate(est)
	}
	return est, true
}

func gpuCount(rl corev1.ResourceList) int64 {
	var n int64
	for name, q := range rl {
		if strings.HasSuffix(string(name), "/gpu") {
			n += q.Value()
		}
	}
	return n
}

// templateAsksForSpot reports whether an infrastructure template launches
// spot instances (CAPA: spotMarketOptions or marketType Spot).
func templateAsksForSpot(t *unstructured.Unstructured) bool {
	if _, ok, _ := unstructured.NestedMap(t.Object, "spec", "template", "spec", "spotMarketOptions"); ok {
		return true
	}
	mt, _, _ := unstructured.NestedString(t.Object, "spec", "template", "spec", "marketType")
	return strings.EqualFold(mt, "Spot")
}

// templateIsCapacityBlock reports whether a CAPA template launches into a
// capacity block (marketType CapacityBlock): reserved capacity, never spot.
func templateIsCapacityBlock(t *unstructured.Unstructured) bool {
	mt, _, _ := unstructured.NestedString(t.Object, "spec", "template", "spec", "marketType")
	return strings.EqualFold(mt, "CapacityBlock")
}

// propagatesToNode reports whether Cluster API syncs a Machine label with
// this key to its Node.
func propagatesToNode(key string) bool {
	domain, _, found := strings.Cut(key, "/")
	if !found {
		return false
	}
	for _, d := range []string{"node-role.kubernetes.io", "node-restriction.kubernetes.io", "node.cluster.x-k8s.io"} {
		if domain == d || strings.HasSuffix(domain, "."+d) {
			return true
		}
	}
	return false
}

func sortedTaints(ts []corev1.Taint) []corev1.Taint {
	out := append([]corev1.Taint(nil), ts...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}
