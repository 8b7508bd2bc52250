package cloudprovider

import (
	"context"
	"testing"
	"time"

	"sigs.k8s.io/karpenter/pkg/controllers/node/health"
	coreoptions "sigs.k8s.io/karpenter/pkg/operator/options"

	"github.com/autonode/karpenter-clusterapi/pkg/operator/options"
)

// TestRepairPoliciesValidForCore: core refuses to start node repair with an
// invalid policy set (it panicked with two default fallbacks once, found by
// Karpenter's Repair specs); the default set and one with
// --repair-conditions must both compile in core's matcher.
func TestRepairPoliciesValidForCore(t *testing.T) {
	ctx := coreoptions.ToContext(context.Background(), &coreoptions.Options{FeatureGates: coreoptions.FeatureGates{NodeRepair: true}})
	c := &CloudProvider{}
	if _, err := health.NewRepairPolicyMatcher(ctx, c); err != nil {
		t.Fatalf("default repair policies: %v", err)
	}
	conditions, err := options.ParseRepairConditions("KernelDeadlock=True:10m,ReadonlyFilesystem=True:5m")
	if err != nil {
		t.Fatal(err)
	}
	c.RepairAlso(conditions)
	if got := len(c.RepairPolicies()); got != 4 {
		t.Fatalf("%d repair policies, want 2 default + 2 configured", got)
	}
	if _, err := health.NewRepairPolicyMatcher(ctx, c); err != nil {
		t.Fatalf("repair policies with --repair-conditions: %v", err)
	}
	for _, p := range c.RepairPolicies()[2:] {
		if p.TolerationDuration != 10*time.Minute && p.TolerationDuration != 5*time.Minute {
			t.Errorf("policy %+v: toleration not the configured one", p)
		}
	}
}
