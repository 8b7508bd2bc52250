package caconvert

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/capacity"
)

// NodeClassLabel is the label the conversion adds to the MachineDeployments
// (and, in Machine mode, the infrastructure templates) of one NodeClass, and
// that the NodeClass selects.
const NodeClassLabel = v1alpha1.Group + "/nodeclass"

// ConvertedFromAnnotation on a NodeClass or NodePool names the node groups
// it was converted from and their Cluster.
const ConvertedFromAnnotation = v1alpha1.Group + "/converted-from"

// defaultUnneededTime is cluster-autoscaler's --scale-down-unneeded-time
// default, the closest thing to a NodePool's consolidateAfter.
const defaultUnneededTime = "10m"

// Result is what Convert produces.
type Result struct {
	// Workload are the NodeClasses and NodePools, for the workload cluster
	// of their Cluster (ClusterOf says which).
	Workload []*unstructured.Unstructured
	// Hub are partial MachineDeployments and infrastructure templates: the
	// labels and annotations to add, for server-side apply in the
	// management cluster.
	Hub []*unstructured.Unstructured
	// Findings is the report.
	Findings []Finding
	// Clusters are the Clusters ("<namespace>/<name>") with converted node
	// groups, sorted.
	Clusters []string
	// Read are the node group candidates this run read ("<Kind>
	// <namespace>/<name>"), converted or not: the scope within which a
	// re-run removes what an earlier one wrote and this one does not.
	Read map[string]bool
}

// ClusterOf is the Cluster ("<namespace>/<name>") an output object was
// converted for.
func ClusterOf(o *unstructured.Unstructured) string {
	return o.GetAnnotations()[ConvertedForClusterAnnotation]
}

// ConvertedForClusterAnnotation on a NodeClass or NodePool names the Cluster
// ("<namespace>/<name>") it was converted for: its workload cluster is where
// it goes.
const ConvertedForClusterAnnotation = v1alpha1.Group + "/converted-for-cluster"

// pool is one NodeClass and NodePool: node groups that differ only in what
// Karpenter chooses between (instance type, zone, capacity type).
type pool struct {
	name         string
	groups       []*nodeGroup
	machineMode  bool
	weight       int32
	unneededTime string
}

// Convert converts the node groups of the input. See the package doc.
func Convert(in Input, s Settings) Result {
	res := Result{Read: map[string]bool{}}
	for _, md := range in.MachineDeployments {
		res.Read[KindMachineDeployment+" "+key(md.Namespace, md.Name)] = true
	}
	for _, ms := range in.MachineSets {
		res.Read[KindMachineSet+" "+key(ms.Namespace, ms.Name)] = true
	}
	var groups []*nodeGroup
	mds := append([]clusterv1.MachineDeployment(nil), in.MachineDeployments...)
	sort.Slice(mds, func(i, j int) bool { return key(mds[i].Namespace, mds[i].Name) < key(mds[j].Namespace, mds[j].Name) })
	for i := range mds {
		md := &mds[i]
		g, fs := readNodeGroup(KindMachineDeployment, md.ObjectMeta, md.Spec.ClusterName, md.Spec.Replicas, md.Spec.Template, in.Templates, s)
		res.Findings = append(res.Findings, fs...)
		if g != nil {
			groups = append(groups, g)
		}
	}
	mss := append([]clusterv1.MachineSet(nil), in.MachineSets...)
	sort.Slice(mss, func(i, j int) bool { return key(mss[i].Namespace, mss[i].Name) < key(mss[j].Namespace, mss[j].Name) })
	for i := range mss {
		ms := &mss[i]
		if ownerMachineDeployment(ms) != "" {
			// Cluster API copies the MachineDeployment's annotations onto
			// its MachineSets: the MachineDeployment is the node group.
			continue
		}
		g, fs := readNodeGroup(KindMachineSet, ms.ObjectMeta, ms.Spec.ClusterName, ms.Spec.Replicas, ms.Spec.Template, in.Templates, s)
		res.Findings = append(res.Findings, fs...)
		if g != nil {
			groups = append(groups, g)
		}
	}
	res.Findings = append(res.Findings, expanderFindings(s)...)
	pools := groupIntoPools(groups, s)
	clusters := map[string]bool{}
	for _, p := range pools {
		clusters[key(p.groups[0].namespace, p.groups[0].cluster)] = true
		res.Workload = append(res.Workload, nodeClass(p), nodePool(p))
		res.Hub = append(res.Hub, hubPatches(p, &res.Findings)...)
		res.Findings = append(res.Findings, poolFindings(p, s)...)
	}
	for c := range clusters {
		res.Clusters = append(res.Clusters, c)
	}
	sort.Strings(res.Clusters)
	sortFindings(res.Findings)
	return res
}

func key(ns, name string) string { return ns + "/" + name }

func ownerMachineDeployment(ms *clusterv1.MachineSet) string {
	for _, o := range ms.OwnerReferences {
		if o.Kind == KindMachineDeployment {
			return key(ms.Namespace, o.Name)
		}
	}
	return ""
}

// groupIntoPools puts node groups that Karpenter may choose between into one
// pool: same Cluster, same taints, same other labels, same priority, same
// scale-down delay; MachineDeployments only (each standalone MachineSet is
// a Machine-mode NodeClass of its own: its bootstrap is its own).
func groupIntoPools(groups []*nodeGroup, s Settings) []*pool {
	byKey := map[string]*pool{}
	var out []*pool
	for _, g := range groups {
		var k strings.Builder
		fmt.Fprintf(&k, "%s|%s|", g.namespace, g.cluster)
		if g.kind == KindMachineSet {
			fmt.Fprintf(&k, "ms:%s|", g.name)
		}
		for _, t := range g.taints {
			k.WriteString(taintString(t) + ",")
		}
		k.WriteString("|")
		labelKeys := make([]string, 0, len(g.labels))
		for l := range g.labels {
			labelKeys = append(labelKeys, l)
		}
		sort.Strings(labelKeys)
		for _, l := range labelKeys {
			k.WriteString(l + "=" + g.labels[l] + ",")
		}
		weight := int32(0)
		if s.uses("priority") {
			if p, ok := s.priorityOf(g); ok {
				fmt.Fprintf(&k, "|prio:%d", p)
			}
		}
		unneeded := defaultUnneededTime
		if v, ok := g.options["scaledownunneededtime"]; ok {
			if d, err := time.ParseDuration(strings.TrimSpace(v)); err == nil && d >= 0 {
				unneeded = d.String()
			}
		}
		fmt.Fprintf(&k, "|unneeded:%s", unneeded)
		p := byKey[k.String()]
		if p == nil {
			p = &pool{machineMode: g.kind == KindMachineSet, weight: weight, unneededTime: unneeded}
			byKey[k.String()] = p
			out = append(out, p)
		}
		p.groups = append(p.groups, g)
	}
	// Weights from the priorities of the pools' node groups.
	if s.uses("priority") && len(s.Priorities) > 0 {
		var prios []int
		for _, p := range out {
			if pr, ok := s.priorityOf(p.groups[0]); ok {
				prios = append(prios, pr)
			}
		}
		w := weights(prios)
		for _, p := range out {
			if pr, ok := s.priorityOf(p.groups[0]); ok {
				p.weight = w[pr]
			}
		}
	}
	// A pool keeps the name an earlier run gave one of its node groups, so
	// a changed grouping renames as little as it can; the rest are named
	// after their first node group.
	names := map[string]bool{}
	for _, p := range out {
		for _, g := range p.groups {
			if g.nodeClass != "" && !names[g.nodeClass] {
				p.name = g.nodeClass
				names[g.nodeClass] = true
				break
			}
		}
	}
	for _, p := range out {
		if p.name == "" {
			p.name = poolName(p.groups[0].cluster, p.groups[0].name, names)
		}
	}
	return out
}

// poolName is "<cluster>-<first node group>", a valid label value (NodePool
// names are the karpenter.sh/nodepool label's value), unique in the run.
func poolName(cluster, group string, taken map[string]bool) string {
	base := strings.ToLower(cluster + "-" + group)
	if strings.HasPrefix(group, cluster+"-") || group == cluster {
		base = strings.ToLower(group)
	}
	if len(base) > 63 {
		sum := sha256.Sum256([]byte(base))
		base = strings.TrimRight(base[:52], "-.") + "-" + hex.EncodeToString(sum[:])[:10]
	}
	name := base
	for i := 2; taken[name]; i++ {
		suffix := fmt.Sprintf("-%d", i)
		b := base
		if len(b)+len(suffix) > 63 {
			b = strings.TrimRight(b[:63-len(suffix)], "-.")
		}
		name = b + suffix
	}
	taken[name] = true
	return name
}

func (p *pool) sources() string {
	var s []string
	for _, g := range p.groups {
		s = append(s, g.object())
	}
	return strings.Join(s, ", ")
}

func (p *pool) meta() map[string]any {
	g := p.groups[0]
	return map[string]any{
		"name": p.name,
		"annotations": map[string]any{
			ConvertedFromAnnotation:       p.sources(),
			ConvertedForClusterAnnotation: key(g.namespace, g.cluster),
		},
	}
}

func nodeClass(p *pool) *unstructured.Unstructured {
	spec := map[string]any{}
	selector := map[string]any{"matchLabels": map[string]any{NodeClassLabel: p.name}}
	if !p.machineMode {
		spec["scalableResourceSelector"] = selector
	} else {
		g := p.groups[0]
		bootstrap := map[string]any{}
		if g.bootstrap.ConfigRef.Name != "" {
			bootstrap["configRef"] = map[string]any{"apiGroup": g.bootstrap.ConfigRef.APIGroup, "kind": g.bootstrap.ConfigRef.Kind, "name": g.bootstrap.ConfigRef.Name}
		} else if g.bootstrap.DataSecretName != nil {
			bootstrap["dataSecretName"] = *g.bootstrap.DataSecretName
		}
		mt := map[string]any{
			"infrastructureTemplates": map[string]any{"apiGroup": g.template.APIGroup, "kind": g.template.Kind, "selector": selector},
			"bootstrap":               bootstrap,
		}
		if g.version != "" {
			mt["version"] = g.version
		}
		spec["machineTemplate"] = mt
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.Group + "/v1alpha1",
		"kind":       "ClusterAPINodeClass",
		"metadata":   p.meta(),
		"spec":       spec,
	}}
}

func nodePool(p *pool) *unstructured.Unstructured {
	capacityTypes := []any{"on-demand"}
	for _, g := range p.groups {
		if g.spot {
			capacityTypes = append(capacityTypes, "spot")
			break
		}
	}
	if p.machineMode && p.groups[0].spot {
		capacityTypes = []any{"spot"}
	}
	tmplSpec := map[string]any{
		"nodeClassRef": map[string]any{"group": v1alpha1.Group, "kind": "ClusterAPINodeClass", "name": p.name},
		"requirements": []any{map[string]any{"key": "karpenter.sh/capacity-type", "operator": "In", "values": capacityTypes}},
		// cluster-autoscaler never replaces a node for its age.
		"expireAfter": "Never",
	}
	var taints []any
	for _, t := range p.groups[0].taints {
		m := map[string]any{"key": t.Key, "effect": string(t.Effect)}
		if t.Value != "" {
			m["value"] = t.Value
		}
		taints = append(taints, m)
	}
	if len(taints) > 0 {
		tmplSpec["taints"] = taints
	}
	template := map[string]any{"spec": tmplSpec}
	if labels := nodePoolLabels(p); len(labels) > 0 {
		template["metadata"] = map[string]any{"labels": labels}
	}
	spec := map[string]any{
		"template": template,
		"disruption": map[string]any{
			// cluster-autoscaler removes empty and under-used nodes.
			"consolidationPolicy": "WhenEmptyOrUnderutilized",
			"consolidateAfter":    p.unneededTime,
		},
		"limits": limits(p),
	}
	if p.weight > 0 {
		spec["weight"] = int64(p.weight)
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "karpenter.sh/v1",
		"kind":       "NodePool",
		"metadata":   p.meta(),
		"spec":       spec,
	}}
}

// nodePoolLabels are the labels the pool's node groups share that Karpenter
// does not know from the instance types (its well-known labels) and lets a
// NodePool set: pods that select them can only be planned onto a NodePool
// that declares them.
func nodePoolLabels(p *pool) map[string]any {
	out := map[string]any{}
	for k, v := range p.groups[0].labels {
		if karpv1.WellKnownLabels.Has(k) || karpv1.IsRestrictedLabel(k) != nil {
			continue
		}
		out[k] = v
	}
	return out
}

// limits are the node groups' max-sizes summed: in nodes, and in cpu and
// memory (max-size times the node size).
func limits(p *pool) map[string]any {
	var nodes int64
	cpu, memory := resource.Quantity{}, resource.Quantity{}
	for _, g := range p.groups {
		nodes += int64(g.max)
		for i := int32(0); i < g.max; i++ {
			cpu.Add(g.cpu)
			memory.Add(g.memory)
		}
	}
	return map[string]any{
		"nodes":  fmt.Sprint(nodes),
		"cpu":    cpu.String(),
		"memory": memory.String(),
	}
}

// hubPatches are the labels (and for Machine mode the capacity annotations)
// each node group's objects need.
func hubPatches(p *pool, findings *[]Finding) []*unstructured.Unstructured {
	labels := map[string]any{v1alpha1.KarpenterMemberLabel: "", NodeClassLabel: p.name}
	var out []*unstructured.Unstructured
	for _, g := range p.groups {
		if !p.machineMode {
			out = append(out, partial("cluster.x-k8s.io/"+clusterv1.GroupVersion.Version, KindMachineDeployment, g.namespace, g.name, labels, nil))
			continue
		}
		// Machine mode reads capacity from the template.
		ann := map[string]any{}
		for k, v := range g.annotations {
			if strings.HasPrefix(k, capacity.AnnotationPrefix) {
				ann[k] = v
			}
		}
		if g.templateObj == nil {
			*findings = append(*findings, Finding{Object: g.object(), Field: "spec.template.spec.infrastructureRef", Kind: Todo,
				Message: fmt.Sprintf("its template %s does not exist: create it, then label it %s and %s=%s", g.template, v1alpha1.KarpenterMemberLabel, NodeClassLabel, p.name)})
			continue
		}
		out = append(out, partial(g.templateObj.GetAPIVersion(), g.template.Kind, g.namespace, g.template.Name, labels, ann))
	}
	return out
}

func partial(apiVersion, kind, ns, name string, labels, annotations map[string]any) *unstructured.Unstructured {
	meta := map[string]any{"name": name, "namespace": ns, "labels": labels}
	if len(annotations) > 0 {
		meta["annotations"] = annotations
	}
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": meta}}
}

// optionReasons say why each autoscaling option has no equivalent.
var optionReasons = map[string]string{
	"scaledownutilizationthreshold":    "Karpenter consolidates a node when its pods fit elsewhere more cheaply, not below a utilization threshold",
	"scaledowngpuutilizationthreshold": "Karpenter consolidates a node when its pods fit elsewhere more cheaply, not below a GPU utilization threshold",
	"scaledownunreadytime":             "Karpenter replaces unready nodes by node repair (feature gate NodeRepair: Ready False or Unknown for 30m, or --repair-conditions), not per node group",
	"maxnodeprovisiontime":             "Karpenter gives a node 15 minutes to register, for every NodePool; not configurable per NodePool",
	"ignoredaemonsetsutilization":      "Karpenter counts DaemonSet pods on every node it plans",
	"zeroormaxnodescaling":             "Karpenter launches nodes one NodeClaim at a time",
	"ignorescaledowncooldown":          "Karpenter has no scale-down cooldown; consolidateAfter is the delay",
}

// poolFindings report, for each node group of a pool, what was mapped and
// what was not.
func poolFindings(p *pool, s Settings) []Finding {
	var out []Finding
	for _, g := range p.groups {
		obj := g.object()
		mode := "MachineDeployment mode"
		if p.machineMode {
			mode = "Machine mode (this provider scales MachineDeployments; a standalone MachineSet's template is cloned into Machines instead)"
		}
		out = append(out, Finding{Object: obj, Kind: Mapped, Message: fmt.Sprintf("node group -> NodeClass and NodePool %s, %s", p.name, mode)})
		if p.machineMode {
			out = append(out, Finding{Object: obj, Field: MaxSizeAnnotation, Kind: Mapped,
				Message: fmt.Sprintf("%d -> NodePool %s limits (nodes, cpu, memory); Machine mode has no per-template maximum", g.max, p.name)})
		} else {
			out = append(out, Finding{Object: obj, Field: MaxSizeAnnotation, Kind: Mapped,
				Message: fmt.Sprintf("%d kept: at that many replicas its offering is unavailable; also summed into NodePool %s limits (nodes, cpu, memory)", g.max, p.name)})
		}
		switch {
		case g.minRemoved != "":
			out = append(out, Finding{Object: obj, Field: MinSizeAnnotation, Kind: Mapped,
				Message: fmt.Sprintf("removed (%s): converted with max-size alone; no minimum is kept", g.minRemoved)})
		case g.min > 0 && !p.machineMode:
			out = append(out, Finding{Object: obj, Field: MinSizeAnnotation, Kind: Todo,
				Message: fmt.Sprintf("%d kept: the provider never lowers spec.replicas below it; a Karpenter node removed at the minimum has its Machine replaced by one no NodeClaim owns, "+
					"which keeps Karpenter's unregistered taint, runs no pod and is paid for (up to %d such Machines); and while it is set cluster-autoscaler still scales this node group. "+
					"Remove the annotation to keep no minimum (docs/annotations.md)", g.min, g.min)})
		case g.min > 0:
			out = append(out, Finding{Object: obj, Field: MinSizeAnnotation, Kind: NotCarried,
				Message: fmt.Sprintf("%d: Machine mode keeps no minimum (nodes come for pending pods); the MachineSet keeps its own replicas", g.min)})
		}
		if g.topologyWorker != "" {
			out = append(out, Finding{Object: obj, Field: "metadata.labels", Kind: Todo,
				Message: fmt.Sprintf("owned by the topology of Cluster %s/%s (worker %s): put the labels %s and %s=%s in spec.topology.workers.machineDeployments[name=%s].metadata.labels too, "+
					"so a topology change keeps them, and leave that worker's replicas unset", g.namespace, g.cluster, g.topologyWorker, v1alpha1.KarpenterMemberLabel, NodeClassLabel, p.name, g.topologyWorker)})
		}
		if g.replicas > 0 {
			out = append(out, Finding{Object: obj, Field: "spec.replicas", Kind: Todo,
				Message: fmt.Sprintf("its %d running replicas were started by cluster-autoscaler: Karpenter neither counts nor removes them; once Karpenter's nodes run, annotate those Machines cluster.x-k8s.io/delete-machine and lower spec.replicas by as many", g.replicas)})
		}
		for k, v := range g.annotations {
			switch {
			case k == capacity.CPUKey || k == capacity.MemoryKey || k == capacity.EphemeralDiskKey || k == capacity.MaxPodsKey ||
				k == capacity.LabelsKey || k == capacity.TaintsKey || k == capacity.GPUCountKey || k == capacity.GPUTypeKey:
				where := "read in place"
				if p.machineMode {
					where = "copied to template " + g.template.String()
				}
				msg := fmt.Sprintf("%q %s", v, where)
				if k == capacity.TaintsKey {
					msg += ", and set as NodePool " + p.name + " taints"
				}
				out = append(out, Finding{Object: obj, Field: k, Kind: Mapped, Message: msg})
			case k == DRADriverKey:
				out = append(out, Finding{Object: obj, Field: k, Kind: NotCarried, Message: fmt.Sprintf("%q: GPUs through DRA are not modelled; use gpu-type and gpu-count (device plugin)", v)})
			case strings.HasPrefix(k, OptionsPrefix):
				name := strings.TrimPrefix(k, OptionsPrefix)
				if name == "scaledownunneededtime" {
					out = append(out, Finding{Object: obj, Field: k, Kind: Mapped, Message: fmt.Sprintf("%q -> NodePool %s disruption.consolidateAfter %s (how long a node stays unneeded before removal)", v, p.name, p.unneededTime)})
					continue
				}
				reason, ok := optionReasons[name]
				if !ok {
					reason = "no equivalent in Karpenter"
				}
				out = append(out, Finding{Object: obj, Field: k, Kind: NotCarried, Message: fmt.Sprintf("%q: %s", v, reason)})
			case strings.Contains(k, autoscalerDomain):
				out = append(out, Finding{Object: obj, Field: k, Kind: NotCarried, Message: fmt.Sprintf("%q: no equivalent in Karpenter", v)})
			}
		}
	}
	if s.uses("priority") && p.weight > 0 {
		pr, _ := s.priorityOf(p.groups[0])
		out = append(out, Finding{Object: "NodePool " + p.name, Field: "spec.weight", Kind: Mapped, Message: fmt.Sprintf("priority %d -> weight %d", pr, p.weight)})
	}
	for k, v := range p.groups[0].labels {
		if karpv1.WellKnownLabels.Has(k) {
			continue
		}
		if err := karpv1.IsRestrictedLabel(k); err != nil {
			out = append(out, Finding{Object: "NodePool " + p.name, Field: k, Kind: NotCarried,
				Message: fmt.Sprintf("label %s=%s: a NodePool cannot set it (%v): pods selecting it are not planned onto these nodes", k, v, err)})
			continue
		}
		out = append(out, Finding{Object: "NodePool " + p.name, Field: k, Kind: Mapped,
			Message: fmt.Sprintf("label %s=%s -> spec.template.metadata.labels (Karpenter plans pods that select it onto this NodePool)", k, v)})
	}
	if len(p.groups[0].taints) > 0 || len(p.groups[0].labels) > 0 {
		out = append(out, Finding{Object: "NodePool " + p.name, Kind: Mapped, Message: "its node groups share taints and labels; node groups that differ in them get NodePools of their own"})
	}
	out = append(out, Finding{Object: "NodePool " + p.name, Field: "spec.disruption.consolidateAfter", Kind: Mapped,
		Message: fmt.Sprintf("%s (cluster-autoscaler's scale-down-unneeded-time)", p.unneededTime)})
	return out
}
