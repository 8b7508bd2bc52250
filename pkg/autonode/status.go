package autonode

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// ConditionType is AutoNode's condition on the Cluster: True when
// Karpenter runs for it; its reason says why not otherwise and its message
// names the version.
const ConditionType = "KarpenterAutoNodeReady"

// providerStatus is the Apply step's report: the provider's Deployment as
// last seen (nil before it exists).
func providerStatus(cluster string, d *appsv1.Deployment, want int32, img, version string) Decision {
	switch {
	case want == 0:
		return Decision{Reason: ReasonScaledToZero, Message: fmt.Sprintf(
			"the provider of Cluster %s (%s, AutoNode %s) is scaled to 0 (%s)", cluster, img, version, ReplicasAnnotation)}
	case d == nil || d.Status.ObservedGeneration < d.Generation || d.Status.UpdatedReplicas < want || d.Status.AvailableReplicas == 0:
		available := int32(0)
		if d != nil {
			available = d.Status.AvailableReplicas
		}
		return Decision{Reason: ReasonStarting, Message: fmt.Sprintf(
			"the provider of Cluster %s (%s, AutoNode %s) is starting: %d/%d replicas available", cluster, img, version, available, want)}
	default:
		return Decision{Reason: ReasonRunning, Message: fmt.Sprintf(
			"Karpenter runs for Cluster %s: %s (AutoNode %s), %d/%d replicas available", cluster, img, version, d.Status.AvailableReplicas, want)}
	}
}

// condition is the Cluster's AutoNode condition for a decision, keeping
// the transition time while the status stays.
func condition(c *clusterv1.Cluster, d Decision, now metav1.Time) metav1.Condition {
	status := metav1.ConditionFalse
	if d.Reason == ReasonRunning {
		status = metav1.ConditionTrue
	}
	cond := metav1.Condition{
		Type: ConditionType, Status: status, Reason: d.Reason, Message: d.Message,
		ObservedGeneration: c.Generation, LastTransitionTime: now,
	}
	if old := currentCondition(c); old != nil && old.Status == status {
		cond.LastTransitionTime = old.LastTransitionTime
	}
	return cond
}

func currentCondition(c *clusterv1.Cluster) *metav1.Condition {
	for i := range c.Status.Conditions {
		if c.Status.Conditions[i].Type == ConditionType {
			return &c.Status.Conditions[i]
		}
	}
	return nil
}

// warning: the reasons a user must act on.
func warning(reason string) bool {
	switch reason {
	case ReasonInvalidSetting, ReasonHandInstalledProvider, ReasonWorkloadClusterUnreachable, ReasonApplyFailed:
		return true
	}
	return false
}
