package autonode

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Step is what the controller does next for one Cluster.
type Step int

const (
	// Leave: not opted in and nothing of AutoNode's exists; the Cluster is
	// not touched (not even its status).
	Leave Step = iota
	// Report: change nothing, say why (Reason, Message).
	Report
	// Apply the desired objects.
	Apply
	// DeleteNodePools in the workload cluster: the first step of opting out.
	DeleteNodePools
	// WaitForNodes: the provider still runs while core terminates the
	// NodeClaims and their Machines.
	WaitForNodes
	// RemoveProvider deletes AutoNode's objects of the Cluster.
	RemoveProvider
)

// Condition reasons (ConditionType's), also the events' reasons.
const (
	ReasonRunning                    = "Running"
	ReasonStarting                   = "ProviderStarting"
	ReasonScaledToZero               = "ScaledToZero"
	ReasonWaitingForControlPlane     = "WaitingForControlPlane"
	ReasonWaitingForKubeconfig       = "WaitingForKubeconfig"
	ReasonInvalidSetting             = "InvalidSetting"
	ReasonHandInstalledProvider      = "HandInstalledProvider"
	ReasonRemovingNodes              = "RemovingNodes"
	ReasonWorkloadClusterUnreachable = "WorkloadClusterUnreachable"
	ReasonDisabled                   = "Disabled"
	ReasonApplyFailed                = "ApplyFailed"
)

// Observation is what the controller saw of one Cluster.
type Observation struct {
	Cluster string // "<namespace>/<name>", for messages
	Settings
	// Invalid are the Cluster's malformed settings (Parse).
	Invalid field.ErrorList
	// Deleting: the Cluster is being deleted.
	Deleting bool
	// ControlPlaneInitialized, KubeconfigExists: Cluster API's signals
	// that the workload cluster can be reached.
	ControlPlaneInitialized, KubeconfigExists bool
	// ProviderExists: AutoNode's Deployment of the Cluster exists.
	ProviderExists bool
	// HasCondition: the Cluster carries AutoNode's condition;
	// ConditionReason is its reason.
	HasCondition    bool
	ConditionReason string
	// HandInstalled names a provider AutoNode did not install that serves
	// (or may serve) the Cluster; empty when none.
	HandInstalled string
	// Workload is what opting out looks at in the workload cluster; nil
	// when not looked at.
	Workload *WorkloadObservation
}

// WorkloadObservation is the workload cluster's side of opting out.
type WorkloadObservation struct {
	// Err: the workload cluster could not be read.
	Err        error
	NodePools  int
	NodeClaims int
}

// Decision is the step and what to report.
type Decision struct {
	Step            Step
	Reason, Message string
}

// Decide picks the next step for one Cluster. Bad input and doubt change
// nothing; a Cluster being deleted is left to the garbage collector (its
// owner references), never waited on.
func Decide(o Observation) Decision {
	switch {
	case o.Deleting:
		return Decision{Step: Leave}
	case len(o.Invalid) > 0:
		return Decision{Step: Report, Reason: ReasonInvalidSetting, Message: invalidMessage(o)}
	case o.Enabled:
		return decideEnabled(o)
	case o.ProviderExists:
		return decideOptOut(o)
	case o.HasCondition && o.ConditionReason == ReasonDisabled:
		return Decision{Step: Leave} // it says how the opt-out ended: keep it
	case o.HasCondition:
		return Decision{Step: Report, Reason: ReasonDisabled, Message: fmt.Sprintf("AutoNode is off for Cluster %s: no provider runs for it", o.Cluster)}
	default:
		return Decision{Step: Leave}
	}
}

func decideEnabled(o Observation) Decision {
	switch {
	case !o.ControlPlaneInitialized:
		return Decision{Step: Report, Reason: ReasonWaitingForControlPlane, Message: fmt.Sprintf("the control plane of Cluster %s is not initialized yet", o.Cluster)}
	case !o.KubeconfigExists:
		return Decision{Step: Report, Reason: ReasonWaitingForKubeconfig, Message: fmt.Sprintf("Cluster %s has no kubeconfig Secret yet", o.Cluster)}
	case !o.ProviderExists && o.HandInstalled != "":
		return Decision{Step: Report, Reason: ReasonHandInstalledProvider, Message: fmt.Sprintf(
			"refusing to run a second provider for Cluster %s: %s already serves it (remove it, or the label %s)", o.Cluster, o.HandInstalled, EnabledLabel)}
	default:
		return Decision{Step: Apply}
	}
}

func decideOptOut(o Observation) Decision {
	if o.OnDisable == KeepNodes {
		return Decision{Step: RemoveProvider, Reason: ReasonDisabled, Message: fmt.Sprintf(
			"AutoNode is off for Cluster %s: provider removed, its nodes kept (%s=%s)", o.Cluster, OnDisableAnnotation, KeepNodes)}
	}
	wl := o.Workload
	switch {
	case wl == nil:
		return Decision{Step: Report, Reason: ReasonRemovingNodes, Message: "reading the workload cluster"}
	case wl.Err != nil:
		// Removing the provider now would strand its nodes.
		return Decision{Step: Report, Reason: ReasonWorkloadClusterUnreachable, Message: fmt.Sprintf(
			"opting out: Karpenter's nodes of Cluster %s cannot be checked, the provider stays: %v", o.Cluster, wl.Err)}
	case wl.NodePools > 0:
		return Decision{Step: DeleteNodePools, Reason: ReasonRemovingNodes, Message: fmt.Sprintf(
			"opting out: deleting %d NodePools of Cluster %s; the provider stays until their nodes are gone", wl.NodePools, o.Cluster)}
	case wl.NodeClaims > 0:
		return Decision{Step: WaitForNodes, Reason: ReasonRemovingNodes, Message: fmt.Sprintf(
			"opting out: waiting for Karpenter to remove %d NodeClaims of Cluster %s", wl.NodeClaims, o.Cluster)}
	default:
		return Decision{Step: RemoveProvider, Reason: ReasonDisabled, Message: fmt.Sprintf(
			"AutoNode is off for Cluster %s: Karpenter's nodes removed, then its provider", o.Cluster)}
	}
}

func invalidMessage(o Observation) string {
	msgs := make([]string, 0, len(o.Invalid))
	for _, e := range o.Invalid {
		msgs = append(msgs, e.Error())
	}
	what := "nothing was changed"
	if o.ProviderExists {
		what = "the running provider is left as it is"
	}
	return fmt.Sprintf("Cluster %s: %s; %s", o.Cluster, strings.Join(msgs, "; "), what)
}
