package hub

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// The bookkeeping annotations live on user-visible objects and may be edited
// by hand: reading them never panics, and what is written reads back.
func FuzzBookkeepingAnnotations(f *testing.F) {
	for _, seed := range []string{"", "{}", `{"a":"2026-01-01T00:00:00Z"}`, `["m1","m2"]`, "null", `{"a":1}`, "[", "x"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		md := &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
			PendingNodeClaimsAnnotation: raw, ReleasedMachinesAnnotation: raw,
		}}}
		pending, perr := PendingNodeClaims(md)
		released, rerr := ReleasedMachines(md)
		if pending == nil || released == nil {
			t.Fatal("nil maps returned")
		}
		if perr != nil && len(pending) != 0 {
			t.Fatal("entries returned with an error")
		}
		if rerr != nil && len(released) != 0 {
			t.Fatal("entries returned with an error")
		}
		// Round trip.
		pending["claim"] = time.Unix(1700000000, 0).UTC()
		released["machine"] = true
		SetPendingNodeClaims(md, pending)
		SetReleasedMachines(md, released)
		p2, err := PendingNodeClaims(md)
		if err != nil || len(p2) != len(pending) {
			t.Fatalf("pending did not round-trip: %v %v", p2, err)
		}
		r2, err := ReleasedMachines(md)
		if err != nil || len(r2) != len(released) {
			t.Fatalf("released did not round-trip: %v %v", r2, err)
		}
	})
}
