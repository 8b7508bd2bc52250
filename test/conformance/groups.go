package conformance

import (
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Mode is how the default NodeClass gets its nodes.
type Mode string

// The provider's two modes.
const (
	ModeMachineDeployment Mode = "machinedeployment"
	ModeMachine           Mode = "machine"
)

// Modes lists both modes, MachineDeployment mode first.
var Modes = []Mode{ModeMachineDeployment, ModeMachine}

// ParseMode accepts a mode's name.
func ParseMode(s string) (Mode, error) {
	for _, m := range Modes {
		if string(m) == strings.ToLower(s) {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown mode %q (want %s or %s)", s, ModeMachineDeployment, ModeMachine)
}

// Suites are the suites of the karpenter module that conformance runs.
var Suites = []string{"regression", "disruption"}

// Group is a set of specs of one suite run against one fresh world, so a
// failure does not cascade into the next group. Focus is matched against a
// spec's full text (its containers' texts and its own, space-separated), as
// ginkgo's --focus is; an Ordered container must stay in one group.
type Group struct {
	Suite string
	Name  string
	Focus string
	// Skips leave specs of the group out of a run (ginkgo --skip), each a
	// regular expression over a spec's text; the CI subset adds CISkip.
	Skips []string
	// CI marks the groups `make test` runs (the fast ones); CISkip leaves
	// their slow specs out there (`make conformance` runs them), CIModes
	// names the modes it runs them in (both when empty).
	CI      bool
	CISkip  string
	CIModes []Mode
	// Modes limits the modes the group runs in (both when empty).
	Modes []Mode
	// Minutes is about how long the group takes on an idle 2-core machine
	// (docs/conformance.md): when groups run at once the longest start
	// first.
	Minutes int
	// NodeCPUs narrows the default NodePool to instance types with these
	// vCPU counts, for specs that narrow it so for KWOK's instance types
	// only and depend on the node size they get there.
	NodeCPUs []int
	// BootDelay is how long a launched instance takes to boot and register
	// (the world's ProvisionDelay; world.DefaultProvisionDelay when zero).
	BootDelay time.Duration
	// ReadyDelay is how long a registered Node reports NotReady before it
	// is Ready (the world's NodeReadyDelay; Ready at once when zero).
	ReadyDelay time.Duration
	// Slots is how many of a -parallel run's slots the group takes (1 when
	// zero): fewer worlds run beside a group whose specs allow core only
	// seconds for a step, without serializing it as Alone does.
	Slots int
	// Alone makes a run with -parallel start the group after every other
	// group of the run has ended and start no other beside it: its specs
	// need writes the suite makes one after another to land close
	// together, which a machine loaded by other worlds does not give.
	Alone bool
	// Urgent gives the group's world and suite the CPU first in a -parallel
	// run: the runners of the groups without it run niced (nice 10, about a
	// ninth of the CPU weight of a process at 0), so a step its specs give
	// core seconds for gets them on a machine loaded by other worlds. Unlike
	// Alone and Slots it keeps no other group waiting.
	Urgent bool
	// HostPorts are TCP ports on the host the suite itself listens on while
	// the group runs (not the world's, which are free ports picked at
	// start): two groups holding one of the same never run at once.
	HostPorts []int
}

// repairBreaker matches the text of the Repair specs that trip the
// disruption breaker.
const repairBreaker = `\bbreaker\b`

// RunsIn reports whether the group runs in a mode.
func (g Group) RunsIn(m Mode) bool {
	if len(g.Modes) == 0 {
		return true
	}
	for _, x := range g.Modes {
		if x == m {
			return true
		}
	}
	return false
}

// ID is suite/name.
func (g Group) ID() string { return g.Suite + "/" + g.Name }

// Matches reports whether the group runs a spec of its suite.
func (g Group) Matches(suite, text string) bool {
	if suite != g.Suite || !regexp.MustCompile(g.Focus).MatchString(text) {
		return false
	}
	for _, skip := range g.Skips {
		if regexp.MustCompile(skip).MatchString(text) {
			return false
		}
	}
	return true
}

// Groups are every spec of both suites, split by top-level container (the
// regression suite's Integration container by its children).
var Groups = []Group{
	// NodePool validation and hashing do not depend on the mode: CI runs them once.
	{Suite: "regression", Name: "Validation", Focus: `^Integration Validation `, Minutes: 1, CI: true, CIModes: []Mode{ModeMachineDeployment}},
	{Suite: "regression", Name: "CRDHash", Focus: `^Integration CRD Hash `, Minutes: 1, CI: true, CIModes: []Mode{ModeMachineDeployment}},
	{Suite: "regression", Name: "DaemonSet", Focus: `^Integration DaemonSet `, Minutes: 5},
	// Utilization has 100 pods run on 100 nodes within 10 minutes: 2.2
	// minutes on an idle machine, 10-12 beside seven other worlds, and it
	// failed in both modes in two full runs (2026-11-28), the second with
	// Urgent: two 100-node worlds at once are more than 2 cores carry. The
	// world's Cluster API Machine reconciles ran past their 1-minute timeout,
	// launches queued behind them past core's 5-minute launch timeout, and
	// the 100 nodes took more than the cleanup's 5 minutes to go.
	{Suite: "regression", Name: "Utilization", Focus: `^Integration Utilization `, Minutes: 2, Alone: true},
	{Suite: "regression", Name: "DoNotDisrupt", Focus: `^Integration DoNotDisrupt `, Minutes: 4},
	{Suite: "regression", Name: "StandaloneNodeClaim", Focus: `^NodeClaim StandaloneNodeClaim `, Minutes: 18, CI: true,
		// Nodes that never register wait for core's 15-minute registration timeout or its garbage collection.
		CISkip: `registration timeout|no Instance mapping`},
	{Suite: "regression", Name: "StaticCapacity", Focus: `^StaticCapacity `, Minutes: 18},
	// The CapacityBuffer specs give KWOK 2-CPU instance types "so buffer pods
	// force multiple nodes" and count nodes on that; here the default
	// NodePool is narrowed the same way. Their nodes boot in 20 s, as real
	// ones take tens of seconds: core counts a buffer's virtual pods on a
	// node only from the first provisioning pass after its launch (the
	// buffer controller's, every 30 s), and a node that boots in a second
	// is empty-consolidated before that (docs/conformance.md).
	{Suite: "regression", Name: "CapacityBuffer", Focus: `^CapacityBuffer `, Minutes: 30, NodeCPUs: []int{2}, BootDelay: 20 * time.Second},
	// Chaos's specs start a controller-runtime manager of their own (the
	// taint adder) with the default metrics address, :8080; beside another
	// Chaos world its Start failed and the spec panicked in a goroutine.
	{Suite: "regression", Name: "Chaos", Focus: `^Chaos `, Minutes: 11, HostPorts: []int{8080}},
	{Suite: "regression", Name: "Performance", Focus: `^Performance `, Minutes: 20, Slots: 2, Urgent: true},
	{Suite: "regression", Name: "DefaultTopologySpreadConstraints", Focus: `^DefaultTopologySpreadConstraints `, Minutes: 5, ReadyDelay: 30 * time.Second},
	{Suite: "disruption", Name: "Termination", Focus: `^Termination `, Minutes: 10, CI: true, CIModes: []Mode{ModeMachine},
		// Budgets, grace periods and drain order wait minutes each (9.5 min for the group).
		CISkip: `Emptiness|TerminationGracePeriod|in order`},
	{Suite: "disruption", Name: "Expiration", Focus: `^Expiration `, Minutes: 8},
	{Suite: "disruption", Name: "Drift", Focus: `^Drift `, Minutes: 27},
	{Suite: "disruption", Name: "Repair", Focus: `^Repair `, Minutes: 13, Skips: []string{repairBreaker}},
	// The breaker specs inject a fault into two of five nodes, one write
	// after the other, and expect core to see both before it repairs: with
	// one of five unhealthy (not over the 20 % threshold) it repairs at
	// once. Beside five other worlds (load 36 on 2 cores) the two writes
	// landed 2 s apart and core repaired the first node in between
	// (MachineDeployment mode, 2026-11-27); alone, they land milliseconds
	// apart, as on the machines upstream runs them on.
	{Suite: "disruption", Name: "RepairBreaker", Focus: `^Repair .*` + repairBreaker, Minutes: 4, Alone: true},
	{Suite: "disruption", Name: "Reboot", Focus: `^Reboot `, Minutes: 1},
	{Suite: "disruption", Name: "TerminateFirst", Focus: `^TerminateFirst `, Minutes: 3},
}

// SelectGroups returns the groups whose ID or name matches the regular
// expression (all when empty), only the CI ones when ci is set.
func SelectGroups(expr string, ci bool) ([]Group, error) {
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, fmt.Errorf("groups: %w", err)
	}
	var out []Group
	for _, g := range Groups {
		if ci && !g.CI {
			continue
		}
		if expr == "" || re.MatchString(g.ID()) {
			out = append(out, g)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no group matches %q", expr)
	}
	return out, nil
}
