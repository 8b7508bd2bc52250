package machinedeployment

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// A pass decides on the Machines as this process last wrote them while the
// cache does not show those writes: it never waits for the informer to
// deliver them (one binding per cache lag on a loaded management cluster).
func TestLatestShowsThisProcesssWritesTheCacheLacks(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := &barrier{now: func() time.Time { return now }}
	machine := func(rv, claim string) *clusterv1.Machine {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", ResourceVersion: rv}}
		if claim != "" {
			m.Annotations = map[string]string{v1alpha1.NodeClaimAnnotation: claim}
		}
		return m
	}
	key := types.NamespacedName{Namespace: "ns", Name: "m"}
	b.recordBind("nc", machine("10", "nc"))

	cached := machine("7", "")
	got := latest(b, "Machine", key, cached)
	if got == cached || got.ResourceVersion != "10" || got.Annotations[v1alpha1.NodeClaimAnnotation] != "nc" {
		t.Fatalf("cache at 7, written at 10: got version %s bound to %q, want the written Machine", got.ResourceVersion, got.Annotations[v1alpha1.NodeClaimAnnotation])
	}
	got.Annotations["x"] = "y"
	if again := latest(b, "Machine", key, cached); again.Annotations["x"] != "" {
		t.Fatal("latest returned the barrier's own copy: a caller's change leaked into it")
	}
	if b.shows("Machine", key, cached) {
		t.Fatal("shows: the cache at 7 shows the write at 10")
	}
	if _, ok := b.boundTo("nc"); !ok {
		t.Fatal("boundTo forgot the binding the cache does not show yet")
	}

	caught := machine("12", "nc")
	if got := latest(b, "Machine", key, caught); got != caught {
		t.Fatalf("cache at 12, written at 10: got version %s, want the cache's", got.ResourceVersion)
	}
	if got := latest(b, "Machine", key, cached); got != cached {
		t.Fatal("the entry outlived the cache catching up")
	}

	// Gone from the cache: nothing of it is waited for.
	b.record("Machine", machine("20", "nc"))
	if got := latest[*clusterv1.Machine](b, "Machine", key, nil); got != nil {
		t.Fatalf("a Machine the cache no longer has came back as version %s", got.ResourceVersion)
	}
	// Forgotten after barrierTTL.
	b.record("Machine", machine("30", "nc"))
	now = now.Add(barrierTTL + time.Second)
	if got := latest(b, "Machine", key, cached); got != cached {
		t.Fatal("an entry older than barrierTTL still replaced the cache's copy")
	}
}
