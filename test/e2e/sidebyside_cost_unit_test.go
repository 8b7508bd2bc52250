package e2e

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/autonode/karpenter-clusterapi/test/placement"
)

// The API servers' own counters, summed by verb and resource: codes,
// scopes and versions add up; WATCH is no request of the run's work.
func TestParseRequestTotals(t *testing.T) {
	text := `# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="cluster.x-k8s.io",resource="machines",scope="namespace",subresource="",verb="POST",version="v1beta2"} 100
apiserver_request_total{code="409",component="apiserver",dry_run="",group="cluster.x-k8s.io",resource="machines",scope="namespace",subresource="",verb="POST",version="v1beta2"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="cluster.x-k8s.io",resource="machines",scope="namespace",subresource="status",verb="PATCH",version="v1beta2"} 250
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="WATCH",version="v1"} 7
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="namespace",subresource="",verb="PUT",version="v1"} 10
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="",scope="",subresource="",verb="GET",version=""} 4
apiserver_request_duration_seconds_count{verb="POST"} 99
`
	got, err := parseRequestTotals(text)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"POST machines": 103, "PATCH machines/status": 250, "WATCH nodes": 7, "GET (non-resource)": 4, "PUT leases": 10}
	if len(got) != len(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %v, want %v (all %v)", k, got[k], v, got)
		}
	}
	before := costSnapshot{requests: map[string]map[string]float64{"hub": {"POST machines": 3, "PATCH machines/status": 50}}}
	after := costSnapshot{requests: map[string]map[string]float64{"hub": got}}
	c := after.since(before)
	if req, wr := c.requestTotals("hub"); req != 314 || wr != 310 {
		t.Errorf("run's hub requests %v, writes %v; want 314 and 310 (WATCH aside, PUT a write)", req, wr)
	}
	if _, err := parseRequestTotals(`apiserver_request_total{verb="GET"} x`); err == nil {
		t.Error("a series without a number was read")
	}
}

func TestParsePlacement(t *testing.T) {
	two := placement.CPUs{0, 1}
	for _, tc := range []struct {
		name, hub, workload string
		online              placement.CPUs
		split, pinned       bool
		wantHub, wantWork   string
		err                 string
	}{
		{name: ""},
		{name: "in-process"},
		{name: "shared", online: two, split: true},
		{name: "separated", online: two, split: true, pinned: true, wantHub: "0", wantWork: "1"},
		{name: "separated", online: placement.CPUs{0, 1, 2, 3}, split: true, pinned: true, wantHub: "0", wantWork: "1-3"},
		{name: "separated", hub: "1", workload: "0", online: two, split: true, pinned: true, wantHub: "1", wantWork: "0"},
		{name: "separated", online: placement.CPUs{0}, err: "needs 2 CPUs"},
		{name: "separated", hub: "0-1", workload: "1", online: two, err: "share CPU 1"},
		{name: "separated", hub: "x", online: two, err: "BENCH_HUB_CPUS=x"},
		{name: "apart", err: "none of"},
	} {
		o, err := parsePlacement(tc.name, tc.hub, tc.workload, tc.online)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%+v: error %v, want one with %q", tc, err, tc.err)
			}
			continue
		}
		if err != nil || (o != nil) != tc.split {
			t.Errorf("%+v: %+v, %v", tc, o, err)
			continue
		}
		if o != nil && (len(o.HubCPUs) > 0) != tc.pinned {
			t.Errorf("%+v: pinned %+v", tc, o)
		}
		if tc.pinned && (o.HubCPUs.String() != tc.wantHub || o.WorkloadCPUs.String() != tc.wantWork || slices.Equal(o.HubCPUs, o.WorkloadCPUs)) {
			t.Errorf("%+v: hub %s, workload %s", tc, o.HubCPUs, o.WorkloadCPUs)
		}
	}
}

// The world's work of a mode is held against kwok's plus its floor's.
func TestModeRatiosAgainstTheSum(t *testing.T) {
	results := []runResult{
		{Contender: contenderKWOK, N: 10, HubCPUS: 1, WorkloadCPUS: 9},
		{Contender: contenderFloorMachines, FloorOf: contenderMachine, N: 10, HubCPUS: 8, WorkloadCPUS: 2},
		{Contender: contenderMachine, N: 10, HubCPUS: 12, WorkloadCPUS: 11},
	}
	fr := modeRatios(results, results[2])["sides_cpu_per_node_s"]
	if fr.Sum == nil || *fr.Sum != 2 || fr.ToSum == nil || math.Abs(*fr.ToSum-1.15) > 1e-9 {
		t.Errorf("both sides' CPU per node: %+v, want the sum 2 s and 1.15x", fr)
	}
	if fr := modeRatios(results, results[2])["total_s"]; fr.Sum != nil {
		t.Errorf("a time has no sum: %+v", fr)
	}
}
