package e2e

import (
	"strings"
	"testing"
)

// The bench's exact-count check: a mode or kwok above or below N fails;
// a Cluster API floor below N fails, above N (Cluster API alone made one
// more, as its MachineSet did once at N = 1 000) is a warning, since it is
// not the provider's doing and the floor's time to N still stands.
func TestPeakProblems(t *testing.T) {
	for _, tc := range []struct {
		name          string
		r             runResult
		errs, warning string
	}{
		{"mode exact", runResult{Contender: "machine", PeakNodeClaims: 10, PeakNodes: 10, PeakMachines: 10}, "", ""},
		{"mode one Machine too many", runResult{Contender: "machinedeployment", PeakNodeClaims: 10, PeakNodes: 10, PeakMachines: 11}, "11 Machines at the peak, want exactly 10", ""},
		{"mode one NodeClaim short", runResult{Contender: "machine", PeakNodeClaims: 9, PeakNodes: 10, PeakMachines: 10}, "9 NodeClaims", ""},
		{"kwok has no Machines", runResult{Contender: contenderKWOK, PeakNodeClaims: 10, PeakNodes: 10}, "", ""},
		{"floor has no NodeClaims", runResult{Contender: "capi-md", FloorOf: "machinedeployment", PeakNodes: 10, PeakMachines: 10}, "", ""},
		{"floor overshoots", runResult{Contender: "capi-md", FloorOf: "machinedeployment", PeakNodes: 11, PeakMachines: 11}, "", "11 Machines at the peak: Cluster API alone made more"},
		{"floor short", runResult{Contender: "capi-machines", FloorOf: "machine", PeakNodes: 9, PeakMachines: 10}, "9 Nodes at the peak, want exactly 10", ""},
	} {
		errs, warnings := peakProblems(tc.r, 10)
		if got := strings.Join(errs, "; "); (tc.errs == "") != (got == "") || !strings.Contains(got, tc.errs) {
			t.Errorf("%s: errors %q, want %q", tc.name, got, tc.errs)
		}
		if got := strings.Join(warnings, "; "); (tc.warning == "") != (got == "") || !strings.Contains(got, tc.warning) {
			t.Errorf("%s: warnings %q, want %q", tc.name, got, tc.warning)
		}
	}
}
