package instancetype

import (
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// awsGPU is the GPU an AWS GPU family carries, as AWS's DescribeInstanceTypes
// reports it (name and manufacturer lower-cased as the AWS provider labels
// them; memory per GPU in MiB). Only families whose every size carries the
// same GPU and whose figures are certain are listed; the count comes from the
// capacity. Other GPU types take these labels from the capacity labels
// annotation.
type awsGPU struct {
	name, manufacturer string
	memoryMiB          int
}

var awsGPUs = map[string]awsGPU{
	"p2":   {"k80", "nvidia", 12288},
	"p3":   {"v100", "nvidia", 16384},
	"p3dn": {"v100", "nvidia", 32768},
	"p4d":  {"a100", "nvidia", 40960},
	"p4de": {"a100", "nvidia", 81920},
	"p5":   {"h100", "nvidia", 81920},
	"g3":   {"m60", "nvidia", 8192},
	"g3s":  {"m60", "nvidia", 8192},
	"g4dn": {"t4", "nvidia", 16384},
	"g5":   {"a10g", "nvidia", 24576},
	"g5g":  {"t4g", "nvidia", 16384},
}

// xenFamilies run on the Xen hypervisor (AWS's previous-generation
// families); every other family of a known scheme runs on Nitro, and bare
// metal sizes on none (the AWS provider leaves their hypervisor empty).
var xenFamilies = map[string]bool{
	"c1": true, "c3": true, "c4": true, "cc2": true, "cr1": true,
	"d2": true, "f1": true, "g2": true, "g3": true, "g3s": true, "h1": true, "hs1": true,
	"i2": true, "i3": true, "m1": true, "m2": true, "m3": true, "m4": true,
	"p2": true, "p3": true, "r3": true, "r4": true, "t1": true, "t2": true,
	"x1": true, "x1e": true,
}

// awsLabels derives the AWS provider's labels of an AWS-named instance type
// (see docs/instance-labels.md for each label's source). generic holds the
// provider-domain labels already derived.
func awsLabels(p ParsedName, capacity corev1.ResourceList, generic map[string]string) map[string]string {
	out := map[string]string{
		v1alpha1.LabelAWSInstanceCategory:   p.Category,
		v1alpha1.LabelAWSInstanceFamily:     p.Family,
		v1alpha1.LabelAWSInstanceGeneration: p.Generation,
		v1alpha1.LabelAWSInstanceSize:       p.Size,
		v1alpha1.LabelAWSInstanceCPU:        generic[v1alpha1.LabelInstanceCPU],
		v1alpha1.LabelAWSInstanceMemory:     generic[v1alpha1.LabelInstanceMemory],
		v1alpha1.LabelAWSInstanceGPUCount:   generic[v1alpha1.LabelInstanceGPUCount],
		v1alpha1.LabelAWSInstanceGPUName:    generic[v1alpha1.LabelInstanceGPUName],
		v1alpha1.LabelAWSInstanceGPUMemory:  generic[v1alpha1.LabelInstanceGPUMemory],
	}
	if generic[v1alpha1.LabelInstanceGPUName] != "" {
		out[v1alpha1.LabelAWSInstanceGPUManufacturer] = generic[v1alpha1.LabelInstanceGPUManufacturer]
	}
	if !strings.HasPrefix(p.Size, "metal") {
		out[v1alpha1.LabelAWSInstanceHypervisor] = "nitro"
		if xenFamilies[p.Family] {
			out[v1alpha1.LabelAWSInstanceHypervisor] = "xen"
		}
	}
	// The name says whether there are local NVMe disks (a "d" after the
	// generation: m5d, c6gd, r5dn), not how large they are: the size is the
	// ephemeral-disk capacity the user gives (GiB), else the label is left
	// out rather than made up.
	if strings.Contains(p.FamilySuffix, "d") {
		if q, ok := capacity[corev1.ResourceEphemeralStorage]; ok && q.Value() > 0 {
			out[v1alpha1.LabelAWSInstanceLocalNVMe] = strconv.FormatInt(q.Value()/(1<<30), 10)
		}
	}
	return out
}
