package machine

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

func reservedMachine(name, claim, id string) *clusterv1.Machine {
	return &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Annotations: map[string]string{
		v1alpha1.NodeClaimAnnotation: claim, v1alpha1.ReservationIDAnnotation: id,
	}}}
}

// The invariants of Reservations: a launch is admitted only while held +
// pending < count; a NodeClaim counts once (pending, then held); slots come
// back when the Machine is gone or the launch gave up.
func TestReservationsCountSlots(t *testing.T) {
	changes := 0
	r := NewReservations(func() { changes++ })
	h := r.handler()
	if !r.Reserve("cr", "a", 2) || !r.Reserve("cr", "a", 2) || !r.Reserve("cr", "b", 2) {
		t.Fatal("two launches must fit a reservation of 2 (and Reserve is idempotent)")
	}
	if r.Reserve("cr", "c", 2) {
		t.Fatal("a third launch was admitted into a full reservation of 2")
	}
	if got := r.Used("cr"); got != 2 {
		t.Fatalf("used %d, want 2", got)
	}
	// a's Machine appears: pending becomes held, the count stays.
	ma := reservedMachine("m-a", "a", "cr")
	h.OnAdd(ma, false)
	h.OnUpdate(ma, ma)
	if got := r.Used("cr"); got != 2 {
		t.Fatalf("after a's Machine appeared, used %d, want 2", got)
	}
	// b's launch gives up before its Machine exists: its slot is free.
	r.Unreserve("cr", "b")
	if got := r.Used("cr"); got != 1 || !r.Reserve("cr", "c", 2) {
		t.Fatalf("after b gave up, used %d, and c must fit", got)
	}
	// a's Machine goes (its instance is terminated): its slot comes back.
	h.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "ns/m-a", Obj: ma})
	if got := r.Used("cr"); got != 1 {
		t.Fatalf("after a's Machine went, used %d, want 1 (c)", got)
	}
	// Machines of other reservations, or none, do not count.
	h.OnAdd(reservedMachine("m-x", "x", "other"), false)
	h.OnAdd(&clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "plain"}}, false)
	if got := r.Used("cr"); got != 1 {
		t.Fatalf("used %d, want 1", got)
	}
	if changes == 0 || r.Version() == 0 {
		t.Error("changes must be announced, so resolved offerings are recomputed")
	}
}
