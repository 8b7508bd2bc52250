package machinedeployment

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
)

// The NodeClaim watch wakes a Launch waiting for its NodeClaim when the
// NodeClaim's deletion begins (the update that sets its deletionTimestamp),
// so that the Launch stops waiting for a Machine no pass binds to a
// NodeClaim being deleted; other updates (conditions, labels) wake nobody.
// Launch's own stop is tested in the model
// (TestLaunchStopsWaitingWhenItsNodeClaimIsDeleted).
func TestNodeClaimWatchWakesTheLaunchOfADeletedNodeClaim(t *testing.T) {
	p := &Provider{waiters: hub.NewWaiters()}
	c := &Controller{provider: p}
	h := c.nodeClaimHandler()
	ctx := context.Background()
	live := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "nc-1"}}
	relabelled := live.DeepCopy()
	relabelled.Labels = map[string]string{"a": "b"}
	deleting := live.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Date(2026, 11, 29, 5, 32, 20, 0, time.UTC)}
	deleting.Finalizers = []string{karpv1.TerminationFinalizer}

	woken := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}

	ch := p.waiters.Register("nc-1")
	h.Update(ctx, event.TypedUpdateEvent[*karpv1.NodeClaim]{ObjectOld: live, ObjectNew: relabelled}, nil)
	if woken(ch) {
		t.Error("an update that does not delete the NodeClaim woke its Launch")
	}
	h.Update(ctx, event.TypedUpdateEvent[*karpv1.NodeClaim]{ObjectOld: relabelled, ObjectNew: deleting}, nil)
	if !woken(ch) {
		t.Error("the update that set the NodeClaim's deletionTimestamp did not wake its Launch")
	}
}
