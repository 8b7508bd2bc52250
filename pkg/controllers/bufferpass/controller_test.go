package bufferpass

import (
	"context"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

func claim(group, providerID string) *karpv1.NodeClaim {
	nc := &karpv1.NodeClaim{}
	nc.Name = "nc"
	nc.Spec.NodeClassRef = &karpv1.NodeClassReference{Group: group, Kind: "ClusterAPINodeClass", Name: "default"}
	nc.Status.ProviderID = providerID
	return nc
}

// Only the launch of one of the provider's NodeClaims wakes the provisioner.
func TestLaunchedPassesOnlyTheLaunch(t *testing.T) {
	p := Launched()
	const id = "aws:///us-east-1a/i-0123"
	cases := []struct {
		name     string
		old, cur *karpv1.NodeClaim
		want     bool
	}{
		{"launch", claim(v1alpha1.Group, ""), claim(v1alpha1.Group, id), true},
		{"a later update", claim(v1alpha1.Group, id), claim(v1alpha1.Group, id), false},
		{"no providerID yet", claim(v1alpha1.Group, ""), claim(v1alpha1.Group, ""), false},
		{"another provider's NodeClaim", claim("karpenter.k8s.aws", ""), claim("karpenter.k8s.aws", id), false},
	}
	for _, c := range cases {
		if got := p.Update(event.UpdateEvent{ObjectOld: c.old, ObjectNew: c.cur}); got != c.want {
			t.Errorf("%s: %t, want %t", c.name, got, c.want)
		}
	}
	if p.Create(event.CreateEvent{Object: claim(v1alpha1.Group, id)}) {
		t.Error("a NodeClaim listed at start woke the provisioner")
	}
	if p.Delete(event.DeleteEvent{Object: claim(v1alpha1.Group, id)}) {
		t.Error("a deleted NodeClaim woke the provisioner")
	}
}

func TestReconcileTriggers(t *testing.T) {
	n := 0
	c := NewController(func() { n++ })
	if _, err := c.Reconcile(context.Background(), reconcile.Request{}); err != nil || n != 1 {
		t.Fatalf("Reconcile: %v, %d triggers, want 1", err, n)
	}
}
