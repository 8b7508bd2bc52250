package conformance

import "regexp"

// Inapplicable is a spec that cannot pass against Cluster API, with the
// reason. The runner does not run it and reports it skipped with the
// reason; docs/conformance.md lists them. "It is slow" or "it flakes" is
// never a reason: fix the product or the world instead.
type Inapplicable struct {
	Suite string
	// Spec is a regular expression over the spec's full text.
	Spec string
	// Modes it cannot pass in (both when empty).
	Modes  []Mode
	Reason string
}

// registrationReason: the suites block a node's registration with an
// admission policy that rejects creating a Node labelled registration=fail,
// a label they put on the NodeClaim (or the NodePool's template). A real
// cloud provider hands the NodeClaim's labels to the kubelet (--node-labels
// in the user data), so the Node is created with it and refused. Machine
// mode does the same through each Machine's own KubeadmConfig (the fleet
// bootstraps from a KubeadmConfigTemplate); a MachineDeployment's Machines
// all share its bootstrap template, so MachineDeployment mode cannot.
const registrationReason = "needs the NodeClaim's labels on the kubelet's command line: a MachineDeployment's " +
	"Machines share its bootstrap template, so the Node registers without the label (Karpenter adds it after " +
	"registration) and the suite's admission policy never blocks it (Machine mode runs these specs)"

// createRaceReason: the spec overwrites the new NodeClaim's status (a
// made-up providerID; Launched, Registered and Initialized True) a few API
// calls after creating it and waits for core to garbage-collect it. Core's
// launch patches the status after Create returns, from the NodeClaim it
// read before Create: a write that lands while Create runs is replaced (the
// real providerID, the conditions reset), and the NodeClaim, now its real
// instance's, waits out core's 15-minute registration timeout. KWOK's
// Create returns within the same millisecond, so there the suite's write
// always comes after core's patch; a Machine's instance gets its providerID
// in seconds (as an EC2 launch does), so the outcome is decided by which
// write reaches the API server first.
const createRaceReason = "assumes Create returns before the suite's next write (KWOK's does at once): the suite " +
	"overwrites the NodeClaim's status while a Machine's instance is still launching, and core's launch patch " +
	"then replaces that write with the real providerID, so the NodeClaim waits for core's 15-minute registration " +
	"timeout; it passes only when the suite's write beats core's first patch"

// NotApplicable lists the specs that cannot pass here.
var NotApplicable = []Inapplicable{
	{Suite: "regression", Spec: `^NodeClaim StandaloneNodeClaim should delete a NodeClaim after the registration timeout when the node doesn't register$`, Modes: []Mode{ModeMachineDeployment}, Reason: registrationReason},
	{Suite: "regression", Spec: `^NodeClaim StandaloneNodeClaim should succeed to garbage collect an Instance that was launched by a NodeClaim but has no Instance mapping$`, Modes: []Mode{ModeMachineDeployment}, Reason: registrationReason},
	{Suite: "disruption", Spec: `^Drift Failure should not disrupt a drifted node if the replacement node never registers$`, Modes: []Mode{ModeMachineDeployment}, Reason: registrationReason},
	{Suite: "regression", Spec: `^NodeClaim StandaloneNodeClaim should succeed to garbage collect an Instance that was launched by a NodeClaim but has no Instance mapping$`, Modes: []Mode{ModeMachine}, Reason: createRaceReason},
}

// notApplicable returns the reason a spec cannot pass in a mode.
func notApplicable(suite, text string, mode Mode) (string, bool) {
	for _, na := range NotApplicable {
		if na.Suite != suite || !regexp.MustCompile(na.Spec).MatchString(text) {
			continue
		}
		if len(na.Modes) == 0 {
			return na.Reason, true
		}
		for _, m := range na.Modes {
			if m == mode {
				return na.Reason, true
			}
		}
	}
	return "", false
}
