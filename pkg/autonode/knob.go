package autonode

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// The knob: a label on the Cluster, so that clusterctl templates and
// ClusterClass-based Cluster manifests carry it, and label selectors find
// every Cluster that runs Karpenter.
const (
	EnabledLabel = "karpenter.cluster.x-k8s.io/autonode"
	Enabled      = "enabled"
	Disabled     = "disabled"
)

// Optional settings, annotations on the Cluster.
const (
	annotationPrefix = "autonode.karpenter.cluster.x-k8s.io/"
	// ApproveKubeletCSRsAnnotation "true" runs the provider with
	// --approve-kubelet-csrs.
	ApproveKubeletCSRsAnnotation = annotationPrefix + "approve-kubelet-csrs"
	// ReplicasAnnotation is the provider's replicas (0 to MaxReplicas; 1 by default).
	ReplicasAnnotation = annotationPrefix + "replicas"
	// ResourcesAnnotation is the container's requests, "cpu=500m,memory=1Gi";
	// the memory request is also its limit.
	ResourcesAnnotation = annotationPrefix + "resources"
	// LogLevelAnnotation is Karpenter core's LOG_LEVEL.
	LogLevelAnnotation = annotationPrefix + "log-level"
	// ImageAnnotation runs another image than the controller's own version.
	ImageAnnotation = annotationPrefix + "image"
	// OnDisableAnnotation says what opting out does: RemoveNodes (default)
	// deletes the NodePools and waits for Karpenter to remove its nodes
	// before the provider goes; KeepNodes removes the provider at once and
	// leaves the nodes, NodeClaims and Machines as they are.
	OnDisableAnnotation = annotationPrefix + "on-disable"
)

// What opting out does (OnDisableAnnotation).
const (
	RemoveNodes = "RemoveNodes"
	KeepNodes   = "KeepNodes"
)

// MaxReplicas bounds ReplicasAnnotation: more replicas only add standbys.
const MaxReplicas = 5

var logLevels = []string{"debug", "info", "warn", "error"}

// Settings are a Cluster's AutoNode settings, validated.
type Settings struct {
	// Enabled: the label says enabled.
	Enabled            bool
	ApproveKubeletCSRs bool
	Replicas           int32
	Requests           corev1.ResourceList
	LogLevel           string
	// Image is empty for the controller's own.
	Image     string
	OnDisable string
}

// DefaultRequests are the container's requests without ResourcesAnnotation.
func DefaultRequests() corev1.ResourceList {
	return corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("1Gi")}
}

// Parse reads a Cluster's knob and settings. Every malformed one is in the
// error list, each naming its label or annotation; Settings is then only
// good for OnDisable and Enabled when those parsed.
func Parse(c *clusterv1.Cluster) (Settings, field.ErrorList) {
	s := Settings{Replicas: 1, Requests: DefaultRequests(), LogLevel: "info", OnDisable: RemoveNodes}
	var errs field.ErrorList
	labels := field.NewPath("metadata", "labels")
	annotations := field.NewPath("metadata", "annotations")
	switch v := c.Labels[EnabledLabel]; v {
	case Enabled:
		s.Enabled = true
	case Disabled, "":
	default:
		errs = append(errs, field.NotSupported(labels.Key(EnabledLabel), v, []string{Enabled, Disabled}))
	}
	a := c.Annotations
	if v, ok := a[ApproveKubeletCSRsAnnotation]; ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, field.Invalid(annotations.Key(ApproveKubeletCSRsAnnotation), v, "must be true or false"))
		}
		s.ApproveKubeletCSRs = b
	}
	if v, ok := a[ReplicasAnnotation]; ok {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 0 || n > MaxReplicas {
			errs = append(errs, field.Invalid(annotations.Key(ReplicasAnnotation), v, fmt.Sprintf("must be a whole number from 0 to %d", MaxReplicas)))
		}
		s.Replicas = int32(n)
	}
	if v, ok := a[ResourcesAnnotation]; ok {
		r, err := parseRequests(v)
		if err != nil {
			errs = append(errs, field.Invalid(annotations.Key(ResourcesAnnotation), v, err.Error()))
		}
		s.Requests = r
	}
	if v, ok := a[LogLevelAnnotation]; ok {
		if !oneOf(v, logLevels) {
			errs = append(errs, field.NotSupported(annotations.Key(LogLevelAnnotation), v, logLevels))
		}
		s.LogLevel = v
	}
	if v, ok := a[ImageAnnotation]; ok {
		if v == "" || strings.ContainsAny(v, " \t\n") {
			errs = append(errs, field.Invalid(annotations.Key(ImageAnnotation), v, "must be an image reference"))
		}
		s.Image = v
	}
	if v, ok := a[OnDisableAnnotation]; ok {
		if !oneOf(v, []string{RemoveNodes, KeepNodes}) {
			errs = append(errs, field.NotSupported(annotations.Key(OnDisableAnnotation), v, []string{RemoveNodes, KeepNodes}))
		} else {
			s.OnDisable = v
		}
	}
	// The objects are named after the Cluster: they need room for a suffix.
	if len(c.Name)+len(nameSuffix) > validation.DNS1123LabelMaxLength {
		errs = append(errs, field.TooLong(field.NewPath("metadata", "name"), c.Name, validation.DNS1123LabelMaxLength-len(nameSuffix)))
	}
	return s, errs
}

// parseRequests reads "cpu=500m,memory=1Gi": cpu and memory only, each at
// most once, positive.
func parseRequests(v string) (corev1.ResourceList, error) {
	out := DefaultRequests()
	seen := map[string]bool{}
	for _, part := range strings.Split(v, ",") {
		name, qty, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("%q is not name=quantity (cpu=500m,memory=1Gi)", part)
		}
		if name != string(corev1.ResourceCPU) && name != string(corev1.ResourceMemory) {
			return nil, fmt.Errorf("resource %q: only cpu and memory", name)
		}
		if seen[name] {
			return nil, fmt.Errorf("resource %q given twice", name)
		}
		seen[name] = true
		q, err := resource.ParseQuantity(qty)
		if err != nil {
			return nil, fmt.Errorf("resource %q: %w", name, err)
		}
		if q.Sign() <= 0 {
			return nil, fmt.Errorf("resource %q must be positive", name)
		}
		out[corev1.ResourceName(name)] = q
	}
	return out, nil
}

func oneOf(v string, allowed []string) bool {
	for _, a := range allowed {
		if v == a {
			return true
		}
	}
	return false
}
