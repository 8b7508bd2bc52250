package coexistence

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
)

func ownedBy(manager, sub string) metav1.ManagedFieldsEntry {
	return metav1.ManagedFieldsEntry{Manager: manager, Subresource: sub, Operation: metav1.ManagedFieldsOperationUpdate,
		FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:replicas":{}}}`)}}
}

// SoleScaler says what is true now: False while another autoscaler changed
// the replicas within the window, also once Karpenter has written them
// since; True once it has not for that long, also while it still owns the
// field (a finished migration); the advice follows the annotations.
func TestSoleScalerFollowsTheWindowNotTheFieldsOwner(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	win := 2 * time.Minute
	md := &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "general",
		Annotations:   map[string]string{clusterv1.AutoscalerMinSizeAnnotation: "1", clusterv1.AutoscalerMaxSizeAnnotation: "4"},
		ManagedFields: []metav1.ManagedFieldsEntry{ownedBy("cluster-autoscaler", "scale")}}}
	var s sightings

	// Found owning the field at start: False for a window from then.
	seen, found := s.last(md, t0)
	msg, left := verdict(md, seen, found, t0, win)
	if msg == "" || left != win || !strings.Contains(msg, "remove its min-size annotation") {
		t.Fatalf("at start: %q, %s", msg, left)
	}
	// min-size removed, cluster-autoscaler idle: True after the window, while it still owns the field.
	delete(md.Annotations, clusterv1.AutoscalerMinSizeAnnotation)
	seen, found = s.last(md, t0.Add(time.Minute))
	if msg, _ := verdict(md, seen, found, t0.Add(time.Minute), win); !strings.Contains(msg, "no min-size annotation") {
		t.Errorf("within the window, min-size removed: %q, want advice for the current annotations", msg)
	}
	seen, found = s.last(md, t0.Add(win))
	if msg, _ := verdict(md, seen, found, t0.Add(win), win); msg != "" {
		t.Errorf("after the window with no change: %q, want True", msg)
	}
	// It writes again, then Karpenter writes: still False until a window after its write.
	s.saw(types.NamespacedName{Namespace: "ns", Name: "general"}, t0.Add(5*time.Minute), []Writer{{Manager: "cluster-autoscaler", Subresource: "scale"}})
	md.ManagedFields = []metav1.ManagedFieldsEntry{ownedBy(hub.FieldManager, "")}
	now := t0.Add(6 * time.Minute)
	seen, found = s.last(md, now)
	if msg, left := verdict(md, seen, found, now, win); msg == "" || left != time.Minute {
		t.Errorf("Karpenter wrote after cluster-autoscaler: %q, %s; want False for one more minute", msg, left)
	}
	now = t0.Add(7 * time.Minute)
	seen, found = s.last(md, now)
	if msg, _ := verdict(md, seen, found, now, win); msg != "" {
		t.Errorf("a window after its last write: %q, want True", msg)
	}
}
