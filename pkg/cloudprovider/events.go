package cloudprovider

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// RecordEventsWith makes Create record a Launched event on each NodeClaim it
// launches, naming the Machine and what it was made from: a NodeClaim's
// events are where `kubectl describe nodeclaim` users look first.
func (c *CloudProvider) RecordEventsWith(r events.Recorder) { c.events = r }

// launched records the Launched event of a NodeClaim whose Machine has a
// providerID: once per NodeClaim, as Create succeeds once; not when the
// mode has named the Machine on the NodeClaim's events already
// (launch.Launched.Announced).
func (c *CloudProvider) launched(nodeClaim *karpv1.NodeClaim, m *clusterv1.Machine, created *karpv1.NodeClaim, from string, announced bool) {
	if c.events == nil || m == nil || announced {
		return
	}
	c.events.Publish(events.Event{
		InvolvedObject: nodeClaim,
		Type:           corev1.EventTypeNormal,
		Reason:         "Launched",
		Message:        launchedMessage(m, created, from),
		DedupeValues:   []string{string(nodeClaim.UID)},
	})
}

func launchedMessage(m *clusterv1.Machine, created *karpv1.NodeClaim, from string) string {
	if from != "" {
		from = " from " + from
	}
	what := []string{created.Labels[corev1.LabelInstanceTypeStable]}
	if zone := created.Labels[corev1.LabelTopologyZone]; zone != "" {
		what = append(what, "in "+zone)
	}
	ct := created.Labels[karpv1.CapacityTypeLabelKey]
	if id := created.Labels[v1alpha1.LabelCapacityReservationID]; id != "" {
		ct += ", reservation " + id
	}
	return fmt.Sprintf("Machine %s/%s%s: %s (%s), providerID %s", m.Namespace, m.Name, from, strings.Join(what, " "), ct, created.Status.ProviderID)
}
