package autonode

import (
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

func ready(o Observation) Observation {
	o.Cluster = "team-a/prod"
	o.ControlPlaneInitialized, o.KubeconfigExists = true, true
	if o.OnDisable == "" {
		o.OnDisable = RemoveNodes
	}
	return o
}

func TestDecide(t *testing.T) {
	invalid := field.ErrorList{field.Invalid(field.NewPath("metadata", "annotations").Key(ReplicasAnnotation), "two", "bad")}
	for _, tc := range []struct {
		name   string
		o      Observation
		step   Step
		reason string
	}{
		{"not opted in: untouched", ready(Observation{}), Leave, ""},
		{"opted in", ready(Observation{Settings: Settings{Enabled: true}}), Apply, ""},
		{"opted in, running: kept up to date", ready(Observation{Settings: Settings{Enabled: true}, ProviderExists: true}), Apply, ""},
		{"control plane not initialized", Observation{Settings: Settings{Enabled: true}, KubeconfigExists: true}, Report, ReasonWaitingForControlPlane},
		{"no kubeconfig", Observation{Settings: Settings{Enabled: true}, ControlPlaneInitialized: true}, Report, ReasonWaitingForKubeconfig},
		{"hand-installed provider", ready(Observation{Settings: Settings{Enabled: true}, HandInstalled: "Deployment x/y"}), Report, ReasonHandInstalledProvider},
		{"malformed: nothing changes", ready(Observation{Settings: Settings{Enabled: true}, Invalid: invalid}), Report, ReasonInvalidSetting},
		{"malformed while running: nothing changes", ready(Observation{Settings: Settings{Enabled: true}, ProviderExists: true, Invalid: invalid}), Report, ReasonInvalidSetting},
		{"malformed while opting out: nothing removed", ready(Observation{ProviderExists: true, Invalid: invalid}), Report, ReasonInvalidSetting},
		{"deleting: left to the garbage collector", ready(Observation{Settings: Settings{Enabled: true}, ProviderExists: true, Deleting: true}), Leave, ""},
		{"opt out: NodePools first", ready(Observation{ProviderExists: true, Workload: &WorkloadObservation{NodePools: 2, NodeClaims: 3}}), DeleteNodePools, ReasonRemovingNodes},
		{"opt out: wait for NodeClaims", ready(Observation{ProviderExists: true, Workload: &WorkloadObservation{NodeClaims: 3}}), WaitForNodes, ReasonRemovingNodes},
		{"opt out: then the provider", ready(Observation{ProviderExists: true, Workload: &WorkloadObservation{}}), RemoveProvider, ReasonDisabled},
		{"opt out: unreachable keeps the provider", ready(Observation{ProviderExists: true, Workload: &WorkloadObservation{Err: errors.New("refused")}}), Report, ReasonWorkloadClusterUnreachable},
		{"opt out keeping nodes", ready(Observation{Settings: Settings{OnDisable: KeepNodes}, ProviderExists: true}), RemoveProvider, ReasonDisabled},
		{"opted out while not running: says so", ready(Observation{HasCondition: true, ConditionReason: ReasonWaitingForKubeconfig}), Report, ReasonDisabled},
		{"opted out earlier: its message stays", ready(Observation{HasCondition: true, ConditionReason: ReasonDisabled}), Leave, ""},
	} {
		d := Decide(tc.o)
		if d.Step != tc.step || d.Reason != tc.reason {
			t.Errorf("%s: got step %d reason %q (%s), want step %d reason %q", tc.name, d.Step, d.Reason, d.Message, tc.step, tc.reason)
		}
	}
}
