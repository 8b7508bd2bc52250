package machine

// Launch steps of Machine mode that a test can crash the provider after
// (see pkg/failpoint: compiled in only with the build tag "failpoints").
const (
	StepInfrastructure = "infrastructure"
	StepBootstrap      = "bootstrap"
	StepMachine        = "machine"
)
