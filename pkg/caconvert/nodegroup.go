// Package caconvert converts a Cluster set up for cluster-autoscaler's
// Cluster API provider into this provider's objects.
//
// cluster-autoscaler treats a MachineDeployment or MachineSet as a node group
// when it carries both the min-size and max-size annotations
// (cluster.x-k8s.io/cluster-api-autoscaler-node-group-{min,max}-size), sizes
// it from zero with the capacity.cluster-autoscaler.kubernetes.io/*
// annotations (or the infrastructure template's status.capacity), and takes
// per-node-group options from cluster.x-k8s.io/autoscaling-options-*
// annotations. Convert reads those objects and returns:
//
//   - the ClusterAPINodeClasses and NodePools (workload cluster) that
//     reproduce the node groups: MachineDeployments in MachineDeployment
//     mode, standalone MachineSets in Machine mode; node groups that differ
//     only in instance type, zone or capacity type share one NodePool, so
//     Karpenter chooses the cheapest of them;
//   - the labels (and, for Machine mode, the capacity annotations) to add to
//     the MachineDeployments and infrastructure templates in the management
//     cluster, as partial objects for server-side apply;
//   - a report: what was mapped and how, and what cannot be carried over and
//     why, each naming the object and the annotation or setting.
//
// Convert is a pure function of its input: no I/O, no clock. A malformed
// annotation or a node group Karpenter cannot size skips that node group
// with a finding; the others are still converted. Nothing here panics on
// user data.
package caconvert

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/capacity"
)

// Annotations of cluster-autoscaler's Cluster API provider beyond the
// capacity ones of package capacity.
const (
	MinSizeAnnotation = clusterv1.AutoscalerMinSizeAnnotation
	MaxSizeAnnotation = clusterv1.AutoscalerMaxSizeAnnotation
	// OptionsPrefix starts the per-node-group autoscaling options, e.g.
	// cluster.x-k8s.io/autoscaling-options-scaledownunneededtime.
	OptionsPrefix = "cluster.x-k8s.io/autoscaling-options-"
	// DRADriverKey names the DRA driver of GPUs (instead of gpu-type).
	DRADriverKey = capacity.AnnotationPrefix + "dra-driver"
	// autoscalerDomain is the suffix of every annotation domain of
	// cluster-autoscaler (capacity.cluster-autoscaler.kubernetes.io,
	// cluster-autoscaler.kubernetes.io).
	autoscalerDomain = "cluster-autoscaler.kubernetes.io/"
)

// Kinds of node groups.
const (
	KindMachineDeployment = "MachineDeployment"
	KindMachineSet        = "MachineSet"
)

// TemplateKey names an infrastructure template.
type TemplateKey struct {
	Namespace, APIGroup, Kind, Name string
}

func (k TemplateKey) String() string {
	return fmt.Sprintf("%s %s/%s", k.Kind, k.Namespace, k.Name)
}

// Input is what Convert reads: the management cluster's objects.
type Input struct {
	MachineDeployments []clusterv1.MachineDeployment
	MachineSets        []clusterv1.MachineSet
	// Templates are the infrastructure templates the node groups name;
	// one missing is a template that does not exist.
	Templates map[TemplateKey]*unstructured.Unstructured
}

// nodeGroup is one node group of cluster-autoscaler, validated.
type nodeGroup struct {
	kind, namespace, name, cluster string
	min, max                       int32
	// nodeClass is the NodeClass an earlier --apply labelled it with.
	nodeClass string
	// minRemoved says why a node group without min-size was converted
	// ("" when it has one).
	minRemoved  string
	replicas    int32
	annotations map[string]string
	capacity    capacity.Capacity
	// cpu and memory per node, from the annotations or the template's
	// status.capacity; zero when unknown.
	cpu, memory resource.Quantity
	taints      []corev1.Taint
	// labels the nodes carry that pods may select on (from the capacity
	// annotation and the Machine template), minus the well-known ones that
	// differ between node groups Karpenter merges.
	labels      map[string]string
	spot        bool
	template    TemplateKey
	templateObj *unstructured.Unstructured
	bootstrap   clusterv1.Bootstrap
	version     string
	// options are the autoscaling-options annotations, by option name.
	options map[string]string
	// topologyWorker is the Cluster topology worker that owns it, if any.
	topologyWorker string
}

// id is the node group's id as cluster-autoscaler's Cluster API provider
// names it, which priority expander patterns match.
func (g *nodeGroup) id() string { return g.kind + "/" + g.namespace + "/" + g.name }

func (g *nodeGroup) object() string { return g.kind + " " + g.namespace + "/" + g.name }

// labelsThatVary are node labels that differ between node groups Karpenter
// merges into one NodePool (each is an offering's own).
var labelsThatVary = map[string]bool{
	corev1.LabelInstanceTypeStable: true, corev1.LabelInstanceType: true,
	corev1.LabelTopologyZone: true, corev1.LabelFailureDomainBetaZone: true,
	corev1.LabelTopologyRegion: true, corev1.LabelFailureDomainBetaRegion: true,
	"karpenter.sh/capacity-type": true,
}

// readNodeGroup validates one scalable resource. It returns nil and the
// findings when the object is no node group or cannot be converted.
func readNodeGroup(kind string, meta metav1.ObjectMeta, cluster string, replicas *int32, tmpl clusterv1.MachineTemplateSpec, templates map[TemplateKey]*unstructured.Unstructured, s Settings) (*nodeGroup, []Finding) {
	g := &nodeGroup{kind: kind, namespace: meta.Namespace, name: meta.Name, cluster: cluster, annotations: meta.Annotations}
	if _, owned := meta.Labels[clusterv1.ClusterTopologyOwnedLabel]; owned {
		g.topologyWorker = meta.Labels[clusterv1.ClusterTopologyMachineDeploymentNameLabel]
	}
	g.nodeClass = meta.Labels[NodeClassLabel]
	if replicas != nil {
		g.replicas = *replicas
	}
	obj := g.object()
	minRaw, hasMin := meta.Annotations[MinSizeAnnotation]
	maxRaw, hasMax := meta.Annotations[MaxSizeAnnotation]
	if !hasMin && !hasMax {
		return nil, nil // not a node group
	}
	var findings []Finding
	bad := func(field, format string, args ...any) {
		findings = append(findings, Finding{Object: obj, Field: field, Kind: Skipped, Message: fmt.Sprintf(format, args...)})
	}
	if hasMax && !hasMin {
		// cluster-autoscaler no longer scales it; converted when the
		// min-size was removed on purpose: named by --assume-node-group,
		// or labelled by an earlier --apply.
		switch {
		case s.assumed(meta.Namespace, meta.Name):
			g.minRemoved = "--assume-node-group"
		case meta.Labels[NodeClassLabel] != "":
			g.minRemoved = "converted before: it carries " + NodeClassLabel + "=" + meta.Labels[NodeClassLabel]
		}
	}
	if (!hasMin && g.minRemoved == "") || !hasMax {
		missing := MinSizeAnnotation
		if hasMin {
			missing = MaxSizeAnnotation
		}
		msg := "missing: cluster-autoscaler uses a node group only with both size annotations, so it was not one; not converted"
		if missing == MinSizeAnnotation {
			msg += "; if you removed it to stop cluster-autoscaler, name it with --assume-node-group=" + meta.Name
		}
		bad(missing, "%s", msg)
		return nil, findings
	}
	var err error
	if hasMin {
		if g.min, err = parseSize(minRaw); err != nil {
			bad(MinSizeAnnotation, "%q: %v; not converted", minRaw, err)
		}
	}
	if g.max, err = parseSize(maxRaw); err != nil {
		bad(MaxSizeAnnotation, "%q: %v; not converted", maxRaw, err)
	}
	if len(findings) == 0 && g.max < g.min {
		bad(MaxSizeAnnotation, "max-size %d is below min-size %d; not converted", g.max, g.min)
	}
	parsed, errs := capacity.Parse(meta.Annotations)
	for _, e := range errs {
		bad(e.Key, "%s; not converted", e.Error())
	}
	g.capacity = parsed
	g.template = TemplateKey{Namespace: meta.Namespace, APIGroup: tmpl.Spec.InfrastructureRef.APIGroup, Kind: tmpl.Spec.InfrastructureRef.Kind, Name: tmpl.Spec.InfrastructureRef.Name}
	g.templateObj = templates[g.template]
	g.bootstrap = tmpl.Spec.Bootstrap
	g.version = tmpl.Spec.Version
	g.cpu, g.memory = parsed.Resources[corev1.ResourceCPU], parsed.Resources[corev1.ResourceMemory]
	if g.templateObj != nil {
		if g.cpu.IsZero() {
			g.cpu = templateCapacity(g.templateObj, corev1.ResourceCPU)
		}
		if g.memory.IsZero() {
			g.memory = templateCapacity(g.templateObj, corev1.ResourceMemory)
		}
		g.spot = templateIsSpot(g.templateObj)
	}
	if len(findings) > 0 {
		return nil, findings
	}
	if g.cpu.IsZero() || g.memory.IsZero() {
		where := "its infrastructure template " + g.template.String() + " does not exist"
		if g.template.Name == "" {
			where = "it names no infrastructure template"
		} else if g.templateObj != nil {
			where = "its infrastructure template " + g.template.String() + " has no status.capacity"
		}
		bad(capacity.CPUKey, "no node size: the %s and %s annotations are not both set and %s; Karpenter must know a node's size before launching it: add the annotations; not converted",
			capacity.CPUKey, capacity.MemoryKey, where)
		return nil, findings
	}
	g.taints = append(g.taints, parsed.Taints...)
	for _, t := range tmpl.Spec.Taints {
		g.taints = append(g.taints, corev1.Taint{Key: t.Key, Value: t.Value, Effect: t.Effect})
	}
	sort.Slice(g.taints, func(i, j int) bool { return taintString(g.taints[i]) < taintString(g.taints[j]) })
	g.labels = map[string]string{}
	for k, v := range parsed.Labels {
		if !labelsThatVary[k] {
			g.labels[k] = v
		}
	}
	g.options = map[string]string{}
	for k, v := range meta.Annotations {
		if name, ok := strings.CutPrefix(k, OptionsPrefix); ok {
			g.options[name] = v
		}
	}
	return g, nil
}

// parseSize reads a node group size: a non-negative decimal integer.
func parseSize(s string) (int32, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("not a whole number")
	}
	if n < 0 {
		return 0, fmt.Errorf("negative")
	}
	return int32(n), nil
}

func templateCapacity(t *unstructured.Unstructured, name corev1.ResourceName) resource.Quantity {
	raw, found, err := unstructured.NestedString(t.Object, "status", "capacity", string(name))
	if !found || err != nil {
		return resource.Quantity{}
	}
	q, err := resource.ParseQuantity(raw)
	if err != nil || q.Sign() <= 0 {
		return resource.Quantity{}
	}
	return q
}

// templateIsSpot: an AWSMachineTemplate that asks for spot instances.
func templateIsSpot(t *unstructured.Unstructured) bool {
	if _, found, _ := unstructured.NestedMap(t.Object, "spec", "template", "spec", "spotMarketOptions"); found {
		return true
	}
	mt, _, _ := unstructured.NestedString(t.Object, "spec", "template", "spec", "marketType")
	return mt == "Spot"
}

func taintString(t corev1.Taint) string {
	if t.Value == "" {
		return t.Key + ":" + string(t.Effect)
	}
	return t.Key + "=" + t.Value + ":" + string(t.Effect)
}
