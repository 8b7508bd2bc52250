package remediation

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

func TestDesired(t *testing.T) {
	member := map[string]string{v1alpha1.KarpenterMemberLabel: ""}
	skip := clusterv1.MachineSkipRemediationAnnotation
	cases := []struct {
		name        string
		labels, ann map[string]string
		nodeRepair  bool
		want        map[string]*string // nil: no change
	}{
		{"NodeRepair on: a Karpenter Machine is left to Karpenter", member, nil, true, map[string]*string{skip: ptr(""), SetByProviderAnnotation: ptr(setByNodeRepair)}},
		{"NodeRepair on: already set", member, map[string]string{skip: "", SetByProviderAnnotation: setByNodeRepair}, true, nil},
		{"NodeRepair on: a user's skip-remediation is kept as it is", member, map[string]string{skip: "user"}, true, nil},
		{"NodeRepair on: not Karpenter's Machine", nil, nil, true, nil},
		{"NodeRepair off: ours is removed", member, map[string]string{skip: "", SetByProviderAnnotation: setByNodeRepair}, false, map[string]*string{skip: nil, SetByProviderAnnotation: nil}},
		{"NodeRepair off: a user's is kept", member, map[string]string{skip: ""}, false, nil},
		{"no longer Karpenter's: ours is removed", nil, map[string]string{skip: "", SetByProviderAnnotation: setByNodeRepair}, true, map[string]*string{skip: nil, SetByProviderAnnotation: nil}},
		{"NodeRepair off: a Machine never annotated", member, nil, false, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Labels: tc.labels, Annotations: tc.ann}}
			got, changed := Desired(m, tc.nodeRepair)
			if changed != (tc.want != nil) || len(got) != len(tc.want) {
				t.Fatalf("Desired = %v, %v; want %v", got, changed, tc.want)
			}
			for k, v := range tc.want {
				g, ok := got[k]
				if !ok || (v == nil) != (g == nil) || (v != nil && *v != *g) {
					t.Errorf("%s: got %v, want %v", k, g, v)
				}
			}
		})
	}
}

func ptr(s string) *string { return &s }
