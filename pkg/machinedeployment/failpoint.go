package machinedeployment

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/autonode/karpenter-clusterapi/pkg/machine"
)

// Steps of MachineDeployment mode a crash can be injected after, through the
// test hook machine.CrashAfterEnv set to "<step>:<n>": the process exits
// abruptly the n-th time it completes that step (n defaults to 1), as a
// crash or an evicted pod would. The end-to-end tests use it to prove that
// a launch or a termination interrupted after any step resumes after a
// restart without duplicates, leaks or stuck replicas. Never set it in
// production.
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
)

// crashExitCode is the exit code of an injected crash (pkg/machine's too).
const crashExitCode = 86

var failpoint = parseFailpoint(os.Getenv(machine.CrashAfterEnv))

type failpointSpec struct {
	step string
	n    int64
	hits atomic.Int64
}

// parseFailpoint reads "<step>:<n>" or "<step>"; anything that names no
// step of this package (for example Machine mode's steps) is nil.
func parseFailpoint(v string) *failpointSpec {
	step, count, hasCount := strings.Cut(strings.TrimSpace(v), ":")
	if !strings.HasPrefix(step, "md-") {
		return nil
	}
	n := int64(1)
	if hasCount {
		parsed, err := strconv.ParseInt(count, 10, 64)
		if err != nil || parsed < 1 {
			return nil
		}
		n = parsed
	}
	return &failpointSpec{step: step, n: n}
}

// crashPoint exits the process the n-th time step is reached when the
// failpoint names it.
func crashPoint(step string) {
	f := failpoint
	if f == nil || f.step != step {
		return
	}
	if f.hits.Add(1) == f.n {
		fmt.Fprintf(os.Stderr, "%s=%s:%d: exiting after the %s step\n", machine.CrashAfterEnv, step, f.n, step)
		os.Exit(crashExitCode)
	}
}
