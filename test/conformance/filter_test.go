package conformance

import (
	"regexp"
	"testing"

	corev1 "k8s.io/api/core/v1"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// TestGinkgoFilters: what the runner hands ginkgo selects the same specs as
// Group.Matches, given that ginkgo matches "<suite description> <spec text>".
func TestGinkgoFilters(t *testing.T) {
	termination, ok := groupByID("disruption/Termination")
	if !ok {
		t.Fatal("no disruption/Termination group")
	}
	termination.Skips = []string{termination.CISkip, "^" + regexp.QuoteMeta("Termination should terminate an empty node") + "$"}
	nodeClaim, _ := groupByID("regression/StandaloneNodeClaim")
	repair, _ := groupByID("disruption/Repair")
	breaker, ok := groupByID("disruption/RepairBreaker")
	if !ok || !breaker.Alone {
		t.Fatal("no disruption/RepairBreaker group running alone")
	}
	for _, c := range []struct {
		g    Group
		text string
	}{
		{termination, "Termination should terminate the node and the instance on deletion"},
		{termination, "Termination should drain pods on a node in order"},
		{termination, "Termination Emptiness Budgets should not allow emptiness if the budget is fully blocking"},
		{termination, "Termination should terminate an empty node"},
		{termination, "Expiration should expire the node after the expiration is reached"},
		{nodeClaim, "NodeClaim StandaloneNodeClaim should create a standard NodeClaim"},
		{nodeClaim, "Integration Validation NodePool should error when a restricted label is used in labels (karpenter.sh/nodepool)"},
		{repair, "Repair repairs an isolated unhealthy node"},
		{repair, "Repair trips the budgeted breaker and freezes repair when >20% of the pool is unhealthy"},
		{breaker, "Repair trips the budgeted breaker and freezes repair when >20% of the pool is unhealthy"},
		{breaker, "Repair resumes repair once the pool drops back under the breaker threshold"},
		{breaker, "Repair respects disruption budgets"},
	} {
		full := suiteDescriptions[c.g.Suite] + " " + c.text
		runs := regexp.MustCompile(ginkgoFilter(c.g.Suite, c.g.Focus)).MatchString(full)
		if skip := ginkgoSkip(c.g); skip != "" && regexp.MustCompile(skip).MatchString(full) {
			runs = false
		}
		if want := c.g.Matches(c.g.Suite, c.text); runs != want {
			t.Errorf("%s: ginkgo runs %q: %t, Group.Matches: %t", c.g.ID(), c.text, runs, want)
		}
	}
	// Each Repair spec runs in exactly one of the two groups: the breaker
	// specs alone, the others with the rest.
	for text, wantBreaker := range map[string]bool{
		"Repair repairs an isolated unhealthy node":                                               false,
		"Repair respects disruption budgets":                                                      false,
		"Repair Kubelet conditions NodeReadyFalse":                                                false,
		"Repair trips the budgeted breaker and freezes repair when >20% of the pool is unhealthy": true,
		"Repair resumes repair once the pool drops back under the breaker threshold":              true,
	} {
		if repair.Matches("disruption", text) == wantBreaker || breaker.Matches("disruption", text) != wantBreaker {
			t.Errorf("%q: in Repair %t, in RepairBreaker %t; want %t, %t", text,
				repair.Matches("disruption", text), breaker.Matches("disruption", text), !wantBreaker, wantBreaker)
		}
	}
	if !termination.Matches("disruption", "Termination should terminate the node and the instance on deletion") ||
		termination.Matches("disruption", "Termination should drain pods on a node in order") ||
		termination.Matches("disruption", "Termination should terminate an empty node") {
		t.Error("the Termination CI subset is not what CISkip says")
	}
	// The registration specs: not in the CI subset (they wait for core's
	// registration timeout), run by `make conformance` in Machine mode only.
	ciNodeClaim := nodeClaim
	ciNodeClaim.Skips = append(append([]string(nil), nodeClaim.Skips...), nodeClaim.CISkip)
	registration := []string{
		"NodeClaim StandaloneNodeClaim should delete a NodeClaim after the registration timeout when the node doesn't register",
		"NodeClaim StandaloneNodeClaim should succeed to garbage collect an Instance that was launched by a NodeClaim but has no Instance mapping",
	}
	for _, text := range registration {
		if ciNodeClaim.Matches("regression", text) || !nodeClaim.Matches("regression", text) {
			t.Errorf("%q: in the CI subset %t, in the group %t; want false, true", text, ciNodeClaim.Matches("regression", text), nodeClaim.Matches("regression", text))
		}
		if reason, na := notApplicable("regression", text, ModeMachineDeployment); !na || reason != registrationReason {
			t.Errorf("%q: in MachineDeployment mode not applicable %t (%q), want for the registration reason", text, na, reason)
		}
	}
	// Machine mode passes the NodeClaim's labels to the kubelet, so the
	// registration timeout spec runs there; the garbage-collection spec
	// races its own status write with a launch that takes seconds.
	if _, na := notApplicable("regression", registration[0], ModeMachine); na {
		t.Errorf("%q: not applicable in Machine mode, which passes the NodeClaim's labels to the kubelet", registration[0])
	}
	if reason, na := notApplicable("regression", registration[1], ModeMachine); !na || reason != createRaceReason {
		t.Errorf("%q: in Machine mode not applicable %t (%q), want for the launch race", registration[1], na, reason)
	}
	if !ciNodeClaim.Matches("regression", "NodeClaim StandaloneNodeClaim should create a standard NodeClaim") {
		t.Error("the StandaloneNodeClaim CI subset lost its other specs")
	}
	for _, na := range NotApplicable {
		if na.Reason == "" {
			t.Errorf("%s: no reason", na.Spec)
		}
	}
}

func groupByID(id string) (Group, bool) {
	for _, g := range Groups {
		if g.ID() == id {
			return g, true
		}
	}
	return Group{}, false
}

// The CapacityBuffer group's default NodePool asks for 2-CPU instance types,
// as its specs ask for KWOK's; the others get the NodePool as it is.
func TestDefaultNodePoolNarrowedForItsGroup(t *testing.T) {
	var cb, drift Group
	for _, g := range Groups {
		switch g.Name {
		case "CapacityBuffer":
			cb = g
		case "Drift":
			drift = g
		}
	}
	np := &karpv1.NodePool{}
	if err := yaml.Unmarshal([]byte(defaultNodePool(cb)), np); err != nil {
		t.Fatalf("the CapacityBuffer group's NodePool does not parse: %v\n%s", err, defaultNodePool(cb))
	}
	var found bool
	for _, r := range np.Spec.Template.Spec.Requirements {
		if r.Key == v1alpha1.LabelInstanceCPU {
			found = r.Operator == corev1.NodeSelectorOpIn && len(r.Values) == 1 && r.Values[0] == "2"
		}
	}
	if !found || len(np.Spec.Template.Spec.Requirements) != 3 {
		t.Errorf("requirements %+v, want the default's two and %s In [2]", np.Spec.Template.Spec.Requirements, v1alpha1.LabelInstanceCPU)
	}
	if defaultNodePool(drift) != nodePoolManifest {
		t.Error("a group without NodeCPUs got another NodePool than the default")
	}
}
