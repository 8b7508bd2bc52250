package instancetype

import (
	"regexp"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/karpenter/pkg/scheduling"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// NameScheme is the naming scheme an instance type name follows.
type NameScheme string

const (
	SchemeAWS   NameScheme = "aws"   // m5d.2xlarge
	SchemeAzure NameScheme = "azure" // Standard_D4s_v5
	SchemeGCP   NameScheme = "gcp"   // n2-standard-4
)

// ParsedName is what an instance type name says by its scheme.
type ParsedName struct {
	Scheme     NameScheme
	Category   string
	Family     string
	Generation string // an integer
	Size       string
	// FamilySuffix is what follows the generation in an AWS family (m5ad: "ad").
	FamilySuffix string
}

var (
	// AWS: <category letters><generation digits><suffix>.<size>, e.g.
	// m5d.2xlarge, inf2.xlarge, u-6tb1.metal, mac2-m2pro.metal.
	awsName = regexp.MustCompile(`^([a-z]+)(-[0-9]+tb)?([0-9]+)([a-z0-9-]*)\.([a-z0-9-]+)$`)
	// Azure: Standard_<family letters><vCPUs>[-<constrained vCPUs>]<features>[_<accelerator>][_v<version>],
	// e.g. Standard_D4s_v5, Standard_E4-2ads_v5, Standard_NC24ads_A100_v4, Standard_B2ms.
	azureName = regexp.MustCompile(`^(?i)(?:standard|basic)_([a-z]+)([0-9]+)(-[0-9]+)?([a-z]*)(?:_([a-z0-9]+))??(?:_v([0-9]+))?$`)
	// GCP: <series letter(s)><generation digit>[<variant letter>]-<type>[-<vCPUs>[-lssd...]],
	// e.g. n2-standard-4, e2-medium, c3d-highcpu-8, a2-highgpu-1g, t2a-standard-1.
	gcpName = regexp.MustCompile(`^([a-z]+)([0-9]+)([a-z]?)-([a-z0-9-]+)$`)
)

// ParseName splits an instance type name by the first scheme it follows.
func ParseName(name string) (ParsedName, bool) {
	if m := awsName.FindStringSubmatch(name); m != nil {
		return ParsedName{Scheme: SchemeAWS, Category: m[1], Family: strings.TrimSuffix(name, "."+m[5]),
			Generation: trimZeros(m[3]), Size: m[5], FamilySuffix: m[4]}, true
	}
	if m := azureName.FindStringSubmatch(name); m != nil {
		letters, features, version := strings.ToLower(m[1]), strings.ToLower(m[4]), m[6]
		if version == "" {
			version = "1" // Azure names carry no _v1
		}
		return ParsedName{Scheme: SchemeAzure, Category: letters[:1], Family: letters + features + "v" + version,
			Generation: trimZeros(version), Size: m[2] + m[3]}, true
	}
	if m := gcpName.FindStringSubmatch(name); m != nil {
		return ParsedName{Scheme: SchemeGCP, Category: m[1], Family: m[1] + m[2] + m[3],
			Generation: trimZeros(m[2]), Size: m[4]}, true
	}
	return ParsedName{}, false
}

func trimZeros(s string) string {
	if n, err := strconv.Atoi(s); err == nil {
		return strconv.Itoa(n)
	}
	return s
}

// instanceLabels derives the well-known instance labels of an instance type
// from its name and capacity. aws adds the AWS provider's labels (the type
// comes from an AWSMachineTemplate). Labels that cannot be derived are left
// out; explicit node labels (the capacity labels annotation) win over these.
func instanceLabels(name string, capacity corev1.ResourceList, aws bool) map[string]string {
	out := map[string]string{}
	set := func(k, v string) {
		if v != "" && validLabelValue(v) {
			out[k] = v
		}
	}
	if cpu, ok := capacity[corev1.ResourceCPU]; ok && !cpu.IsZero() {
		set(v1alpha1.LabelInstanceCPU, strconv.FormatInt(cpu.Value(), 10)) // whole vCPUs, rounded up
	}
	if mem, ok := capacity[corev1.ResourceMemory]; ok && !mem.IsZero() {
		set(v1alpha1.LabelInstanceMemory, strconv.FormatInt(mem.Value()/(1<<20), 10))
	}
	gpus, gpuResource := gpuCapacity(capacity)
	if gpus > 0 {
		set(v1alpha1.LabelInstanceGPUCount, strconv.FormatInt(gpus, 10))
		if domain, _, ok := strings.Cut(gpuResource, "/"); ok {
			// nvidia.com/gpu -> nvidia, amd.com/gpu -> amd
			set(v1alpha1.LabelInstanceGPUManufacturer, strings.TrimSuffix(domain, ".com"))
		}
	}
	parsed, ok := ParseName(name)
	if ok {
		set(v1alpha1.LabelInstanceCategory, parsed.Category)
		set(v1alpha1.LabelInstanceFamily, parsed.Family)
		set(v1alpha1.LabelInstanceGeneration, parsed.Generation)
		set(v1alpha1.LabelInstanceSize, parsed.Size)
	}
	if ok && parsed.Scheme == SchemeAWS {
		if g, known := awsGPUs[parsed.Family]; known && gpus > 0 {
			set(v1alpha1.LabelInstanceGPUName, g.name)
			set(v1alpha1.LabelInstanceGPUManufacturer, g.manufacturer)
			set(v1alpha1.LabelInstanceGPUMemory, strconv.Itoa(g.memoryMiB))
		}
	}
	if aws && ok && parsed.Scheme == SchemeAWS {
		for k, v := range awsLabels(parsed, capacity, out) {
			set(k, v)
		}
	}
	return out
}

// instanceLabelRequirements are the instance type's requirements on every
// registered instance label: In its value, or DoesNotExist when it has none,
// so that a NodePool asking for a value (In, Gt, Lt) never selects a type
// that cannot tell, while NotIn and DoesNotExist still do. Keys in skip are
// already required by the caller.
func instanceLabelRequirements(labels map[string]string, skip map[string]bool) []*scheduling.Requirement {
	keys := append(append([]string{}, v1alpha1.InstanceLabels...), v1alpha1.AWSInstanceLabels...)
	out := make([]*scheduling.Requirement, 0, len(keys))
	for _, k := range keys {
		if skip[k] {
			continue
		}
		if v, ok := labels[k]; ok {
			out = append(out, scheduling.NewRequirement(k, corev1.NodeSelectorOpIn, v))
		} else {
			out = append(out, scheduling.NewRequirement(k, corev1.NodeSelectorOpDoesNotExist))
		}
	}
	return out
}

// gpuCapacity sums the GPUs of a capacity (resources named <domain>/gpu)
// and names one of their resources.
func gpuCapacity(rl corev1.ResourceList) (int64, string) {
	var n int64
	name := ""
	for r, q := range rl {
		if strings.HasSuffix(string(r), "/gpu") && q.Value() > 0 {
			n += q.Value()
			if name == "" || string(r) < name {
				name = string(r)
			}
		}
	}
	return n, name
}

var labelValue = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)

func validLabelValue(v string) bool { return labelValue.MatchString(v) }

// instanceLabels are the source's well-known instance labels: those the
// user gave as node labels (the capacity labels annotation), else derived.
func (s *Source) instanceLabels() map[string]string {
	out := instanceLabels(s.Name, s.Capacity, s.AWS)
	for _, k := range append(append([]string{}, v1alpha1.InstanceLabels...), v1alpha1.AWSInstanceLabels...) {
		if v, ok := s.NodeLabels[k]; ok {
			out[k] = v
		}
	}
	return out
}

// isAWSTemplate reports whether an infrastructure template is CAPA's
// AWSMachineTemplate.
func isAWSTemplate(t *unstructured.Unstructured) bool {
	if t == nil {
		return false
	}
	gvk := t.GroupVersionKind()
	return gvk.Group == "infrastructure.cluster.x-k8s.io" && gvk.Kind == "AWSMachineTemplate"
}

func keySet(m map[string]string) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

// templateImageID is the image a CAPA template names (spec.ami.id).
func templateImageID(t *unstructured.Unstructured) string {
	if !isAWSTemplate(t) {
		return ""
	}
	id, _, _ := unstructured.NestedString(t.Object, "spec", "template", "spec", "ami", "id")
	return id
}
