package machinedeployment

// Steps of MachineDeployment mode that a test can crash the provider after
// (see pkg/failpoint: compiled in only with the build tag "failpoints").
const (
	// StepChoose: the MachineDeployment was chosen and recorded on the NodeClaim.
	StepChoose = "md-choose"
	// StepReserve: the replica was raised (pending entry written).
	StepReserve = "md-reserve"
	// StepBind: a Machine was bound to the NodeClaim.
	StepBind = "md-bind"
	// StepLaunched: Launch is about to return the Machine with its providerID.
	StepLaunched = "md-launched"
	// StepMark: the Machine was marked with cluster.x-k8s.io/delete-machine.
	StepMark = "md-mark"
	// StepRelease: the replica of a marked Machine was given back.
	StepRelease = "md-release"
	// StepMove: a launch's reservation was moved off a MachineDeployment
	// whose MachineSet is behind, before it reserves on another.
	StepMove = "md-move"
)
