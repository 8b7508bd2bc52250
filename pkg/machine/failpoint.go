package machine

import (
	"fmt"
	"os"
)

// CrashAfterEnv names a test hook: when the variable is set to a launch
// step (infrastructure, bootstrap or machine), the process exits abruptly
// right after creating that object, as a crash or an evicted pod would.
// The end-to-end tests use it to prove that a launch interrupted at any
// step resumes after a restart without duplicates or leftovers. Never set
// it in production.
const CrashAfterEnv = "KARPENTER_CLUSTERAPI_TEST_CRASH_AFTER"

// Launch steps a crash can be injected after.
const (
	StepInfrastructure = "infrastructure"
	StepBootstrap      = "bootstrap"
	StepMachine        = "machine"
)

var crashAfter = os.Getenv(CrashAfterEnv)

func crashPoint(step string) {
	if crashAfter == step {
		fmt.Fprintf(os.Stderr, "%s=%s: exiting after the %s step of a launch\n", CrashAfterEnv, step, step)
		os.Exit(86)
	}
}
