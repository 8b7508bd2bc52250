// Package conformance runs Karpenter's own end-to-end suites
// (test/suites/regression and test/suites/disruption of the
// sigs.k8s.io/karpenter module in go.mod) against this provider, in
// MachineDeployment mode and in Machine mode, one fresh world of test/world
// per group of specs, and reports every spec (see docs/conformance.md).
//
// The suite binaries come from hack/conformance-bins.sh; cmd/conformance
// (`make conformance`) runs every group, and this package's test runs the
// fast groups (Group.CI) in `make test`.
package conformance
