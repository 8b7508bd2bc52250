package launch

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

func awsMachine(status map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{"status": status}}
}

func TestReadLaunchFailure(t *testing.T) {
	cases := []struct {
		name             string
		status           map[string]any
		failed, capacity bool
	}{
		{"healthy", map[string]any{"ready": true}, false, false},
		{"CAPA retries a capacity error in a condition", map[string]any{"conditions": []any{map[string]any{
			"type": "InstanceReady", "status": "False", "reason": "InstanceProvisionFailed",
			"message": "failed to run instance: InsufficientInstanceCapacity: We currently do not have sufficient m5.large capacity",
		}}}, true, true},
		{"a retried error that is not about capacity", map[string]any{"conditions": []any{map[string]any{
			"type": "InstanceReady", "status": "False", "message": "InvalidParameterValue: bad subnet",
		}}}, false, false},
		{"terminal capacity failure", map[string]any{"failureReason": "InsufficientInstanceCapacity", "failureMessage": "no capacity"}, true, true},
		{"terminal other failure", map[string]any{"failureReason": "CreateError", "failureMessage": "no AMI"}, true, false},
		{"v1beta2 conditions", map[string]any{"v1beta2": map[string]any{"conditions": []any{map[string]any{
			"type": "Ready", "status": "False", "message": "SpotMaxPriceTooLow",
		}}}}, true, true},
		{"garbage conditions", map[string]any{"conditions": []any{"x", 3, map[string]any{"status": 7}}}, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := ReadLaunchFailure(awsMachine(c.status))
			if f.Failed != c.failed || f.InsufficientCapacity != c.capacity {
				t.Fatalf("got %+v, want failed=%v capacity=%v", f, c.failed, c.capacity)
			}
		})
	}
}

func TestUnavailableExpiresAfterTTL(t *testing.T) {
	now := time.Unix(1000, 0)
	changes := 0
	u := NewUnavailable(time.Minute, func() { changes++ })
	u.SetClock(func() time.Time { return now })
	key := instancetype.OfferingKey{InstanceType: "m5.large", Zone: "a", CapacityType: "spot"}
	v0 := u.Version()
	u.Mark(key, "ICE")
	if !u.Has(key) || u.Version() == v0 {
		t.Fatal("a marked offering must be unavailable and change the version")
	}
	if l := u.List(); len(l) != 1 || l[0].Reason != "ICE" {
		t.Fatalf("List = %v", l)
	}
	now = now.Add(59 * time.Second)
	if !u.Has(key) {
		t.Fatal("unavailable until the TTL passes")
	}
	v1 := u.Version()
	now = now.Add(2 * time.Second)
	if u.Has(key) || u.Version() == v1 {
		t.Fatal("after the TTL the offering is available again and the version changed")
	}
	if changes < 2 {
		t.Fatalf("listeners told %d times, want the mark and the expiry", changes)
	}
}
