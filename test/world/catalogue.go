package world

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
)

// GPUResource is the extended resource GPU instance types expose.
const GPUResource corev1.ResourceName = "nvidia.com/gpu"

// Capacity types, spelled like Karpenter's karpenter.sh/capacity-type values.
const (
	CapacityTypeOnDemand = "on-demand"
	CapacityTypeSpot     = "spot"
)

// DefaultAMI is the image AWSMachineTemplate sets. CAPA (and the simulated
// AWS) refuse to launch when neither the AWSMachine's spec.ami.id nor the
// Machine's spec.version is set.
const DefaultAMI = "ami-0123456789abcdef0"

// InstanceType is one entry of the simulated EC2 instance type catalogue.
type InstanceType struct {
	Name   string
	CPU    resource.Quantity
	Memory resource.Quantity
	// Arch is the kubernetes.io/arch value: amd64 or arm64.
	Arch string
	// GPUs is the number of nvidia.com/gpu the instance has.
	GPUs int64
}

func instanceType(name, cpu, memory, arch string, gpus int64) InstanceType {
	return InstanceType{Name: name, CPU: resource.MustParse(cpu), Memory: resource.MustParse(memory), Arch: arch, GPUs: gpus}
}

// InstanceTypes is the simulated EC2 catalogue: what DescribeInstanceTypes
// would say. Tests may read it; treat it as read-only.
var InstanceTypes = map[string]InstanceType{
	"t3.medium":   instanceType("t3.medium", "2", "4Gi", "amd64", 0),
	"m5.large":    instanceType("m5.large", "2", "8Gi", "amd64", 0),
	"m5.xlarge":   instanceType("m5.xlarge", "4", "16Gi", "amd64", 0),
	"m5.2xlarge":  instanceType("m5.2xlarge", "8", "32Gi", "amd64", 0),
	"c5.large":    instanceType("c5.large", "2", "4Gi", "amd64", 0),
	"c5.xlarge":   instanceType("c5.xlarge", "4", "8Gi", "amd64", 0),
	"r5.large":    instanceType("r5.large", "2", "16Gi", "amd64", 0),
	"m6g.large":   instanceType("m6g.large", "2", "8Gi", "arm64", 0),
	"m6i.large":   instanceType("m6i.large", "2", "8Gi", "amd64", 0),
	"m6g.xlarge":  instanceType("m6g.xlarge", "4", "16Gi", "arm64", 0),
	"g4dn.xlarge": instanceType("g4dn.xlarge", "4", "16Gi", "amd64", 1),
}

// InstanceTypeNames returns the catalogue's names, sorted.
func InstanceTypeNames() []string {
	names := make([]string, 0, len(InstanceTypes))
	for n := range InstanceTypes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// TemplateCapacity is what CAPA's AWSMachineTemplate controller writes to
// status.capacity: cpu and memory only (memory in Mi, as EC2 reports it).
func (t InstanceType) TemplateCapacity() corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    t.CPU.DeepCopy(),
		corev1.ResourceMemory: resource.MustParse(fmt.Sprintf("%dMi", t.Memory.Value()/(1<<20))),
	}
}

// NodeInfo is what CAPA's AWSMachineTemplate controller writes to status.nodeInfo.
func (t InstanceType) NodeInfo() *infrav1.NodeInfo {
	return &infrav1.NodeInfo{Architecture: infrav1.Architecture(t.Arch), OperatingSystem: infrav1.OperatingSystemLinux}
}

// AWSMachineTemplate returns an AWSMachineTemplate for an instance type of the
// catalogue with status.capacity and status.nodeInfo filled the way CAPA's
// AWSMachineTemplate controller fills them. Status is a subresource: create
// the object, then write its status (World.CreateAWSMachineTemplate does both).
// The simulated AWS also fills an empty status, like CAPA, once a
// MachineDeployment or MachineSet made the Cluster the template's owner.
// It panics on an instance type missing from InstanceTypes.
func AWSMachineTemplate(namespace, name, instanceType string, spot bool) *infrav1.AWSMachineTemplate {
	it, ok := InstanceTypes[instanceType]
	if !ok {
		panic(fmt.Sprintf("world: instance type %q is not in the catalogue (%s)", instanceType, strings.Join(InstanceTypeNames(), ", ")))
	}
	t := &infrav1.AWSMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: infrav1.AWSMachineTemplateSpec{Template: infrav1.AWSMachineTemplateResource{Spec: infrav1.AWSMachineSpec{
			InstanceType:       instanceType,
			AMI:                infrav1.AMIReference{ID: ptr.To(DefaultAMI)},
			IAMInstanceProfile: "nodes.cluster-api-provider-aws.sigs.k8s.io",
		}}},
		Status: infrav1.AWSMachineTemplateStatus{Capacity: it.TemplateCapacity(), NodeInfo: it.NodeInfo()},
	}
	if spot {
		t.Spec.Template.Spec.SpotMarketOptions = &infrav1.SpotMarketOptions{}
	}
	return t
}

// Defaults of the simulated kubelet: the real kubelet's own. Nothing is
// reserved, the hard eviction thresholds are memory.available<100Mi and
// nodefs.available<10% (imagefs and inode signals do not reduce
// allocatable), and a Node runs at most 110 pods.
const (
	DefaultEvictionHard = "memory.available<100Mi,nodefs.available<10%"
	// DefaultMaxPods is the pods capacity when kubelet args don't set max-pods.
	DefaultMaxPods = 110
	// EphemeralStorage is every simulated instance's root volume.
	EphemeralStorage = "20Gi"
)

// NodeCapacity is the capacity the simulated kubelet reports for an instance
// type: the catalogue's cpu, memory and GPUs, pods (kubelet arg max-pods,
// default 110) and 20Gi ephemeral storage.
func NodeCapacity(t InstanceType, kubeletArgs map[string]string) corev1.ResourceList {
	pods := int64(DefaultMaxPods)
	if v, ok := kubeletArgs["max-pods"]; ok {
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && n >= 0 {
			pods = n
		}
	}
	rl := corev1.ResourceList{
		corev1.ResourceCPU:              t.CPU.DeepCopy(),
		corev1.ResourceMemory:           t.Memory.DeepCopy(),
		corev1.ResourcePods:             *resource.NewQuantity(pods, resource.DecimalSI),
		corev1.ResourceEphemeralStorage: resource.MustParse(EphemeralStorage),
	}
	if t.GPUs > 0 {
		rl[GPUResource] = *resource.NewQuantity(t.GPUs, resource.DecimalSI)
	}
	return rl
}

// KubeletOverhead is what the simulated kubelet holds back from a node of
// this capacity, as the real kubelet computes it: kube-reserved +
// system-reserved ("cpu=100m,memory=1Gi,ephemeral-storage=1Gi") + the hard
// eviction thresholds of memory.available (from memory) and nodefs.available
// (from ephemeral-storage), each a quantity or a percentage of capacity. A
// given eviction-hard replaces the defaults entirely, as the kubelet's flag
// does. Unparsable values are ignored.
func KubeletOverhead(capacity corev1.ResourceList, kubeletArgs map[string]string) corev1.ResourceList {
	out := corev1.ResourceList{}
	add := func(name corev1.ResourceName, q resource.Quantity) {
		cur := out[name]
		cur.Add(q)
		out[name] = cur
	}
	for _, spec := range []string{kubeletArgs["kube-reserved"], kubeletArgs["system-reserved"]} {
		for _, kv := range strings.Split(spec, ",") {
			k, v, found := strings.Cut(strings.TrimSpace(kv), "=")
			if !found {
				continue
			}
			switch name := corev1.ResourceName(strings.TrimSpace(k)); name {
			case corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage:
				if q, err := resource.ParseQuantity(strings.TrimSpace(v)); err == nil && q.Sign() >= 0 {
					add(name, q)
				}
			}
		}
	}
	eviction, ok := kubeletArgs["eviction-hard"]
	if !ok {
		eviction = DefaultEvictionHard
	}
	for _, kv := range strings.Split(eviction, ",") {
		k, v, found := strings.Cut(strings.TrimSpace(kv), "<")
		if !found {
			continue
		}
		var name corev1.ResourceName
		switch strings.TrimSpace(k) {
		case "memory.available":
			name = corev1.ResourceMemory
		case "nodefs.available":
			name = corev1.ResourceEphemeralStorage
		default:
			continue
		}
		v = strings.TrimSpace(v)
		if pct, isPct := strings.CutSuffix(v, "%"); isPct {
			f, err := strconv.ParseFloat(pct, 64)
			if err != nil || f < 0 || f > 100 {
				continue
			}
			c := capacity[name]
			add(name, *resource.NewQuantity(int64(math.Ceil(float64(c.Value())*f/100)), resource.BinarySI))
		} else if q, err := resource.ParseQuantity(v); err == nil && q.Sign() >= 0 {
			add(name, q)
		}
	}
	return out
}

// NodeAllocatable is NodeCapacity minus KubeletOverhead (never below zero).
func NodeAllocatable(t InstanceType, kubeletArgs map[string]string) corev1.ResourceList {
	capacity := NodeCapacity(t, kubeletArgs)
	for name, q := range KubeletOverhead(capacity, kubeletArgs) {
		c, ok := capacity[name]
		if !ok {
			continue
		}
		c.Sub(q)
		if c.Sign() < 0 {
			c = *resource.NewQuantity(0, c.Format)
		}
		capacity[name] = c
	}
	return capacity
}
