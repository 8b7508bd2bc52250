package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// speedBaseline is the committed record of the last release's key figures
// of the short side-by-side run (testdata/bench-baseline.json). Times are
// kept as ratios to kwok measured in the same run, so that a slower or
// busier machine (CI's 2 shared cores) moves both sides alike; writes per
// node are absolute (they do not depend on the machine). Each mode's times
// are held against kwok's (Karpenter's own floor) and against its Cluster
// API floor's (capi-md, capi-machines: Cluster API alone), both run just
// before it in the same world.
type speedBaseline struct {
	Release string `json:"release"`
	// Provisional marks figures not measured on a quiet 2-core machine at a
	// release (none has been made yet): slowdowns are reported, not failed.
	Provisional bool    `json:"provisional,omitempty"`
	MeasuredOn  string  `json:"measured_on"`
	N           int     `json:"n"`
	DelayS      float64 `json:"infra_delay_s"`
	// Contender -> figure -> value.
	Figures map[string]map[string]float64 `json:"figures"`
}

// regressionTolerance: a key figure more than 30 % above the baseline fails.
const regressionTolerance = 1.3

const baselinePath = "test/e2e/testdata/bench-baseline.json"

// keyFigures are the figures the regression check holds against the
// baseline, per mode of this provider: its times as ratios to kwok and to
// its Cluster API floor (from modeRatios), its hub writes per node.
func keyFigures(r runResult) map[string]float64 {
	out := map[string]float64{"hub_writes_per_node": r.HubWritesPerNode}
	for key, name := range map[string]string{"total_s": "total", "pod_start_p50_s": "pod_start_p50"} {
		fr := r.Ratios[key]
		if fr.ToKWOK != nil {
			out[name+"/kwok"] = *fr.ToKWOK
		}
		if fr.ToFloor != nil {
			out[name+"/floor"] = *fr.ToFloor
		}
	}
	return out
}

// TestSpeedAgainstKWOK is the short side-by-side run (N = 50) that guards
// against slowdowns: each mode's time to all pods Running and its median pod
// start, as ratios to Karpenter's kwok provider and to the mode's Cluster
// API floor run just before in the same world, and its hub writes per node,
// each within 30 % of the baseline.
// Scale-down and CPU are printed, not checked (core's disruption polling
// makes a 50-node scale-down vary by a round).
//
// The exact counts (N NodeClaims, Nodes and Machines at the peak, never
// more) are checked in every run. BENCH_WRITE_BASELINE=<release> writes the
// measured figures as the new baseline instead (at a release, on a quiet
// 2-core machine); until then the baseline is provisional and a slowdown is
// reported, not failed.
func TestSpeedAgainstKWOK(t *testing.T) {
	path := filepath.Join(environment.RepoRoot(), baselinePath)
	var base speedBaseline
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading the baseline: %v", err)
	}
	if err := json.Unmarshal(raw, &base); err != nil {
		t.Fatalf("parsing %s: %v", path, err)
	}
	o := benchOptions{Delay: time.Duration(base.DelayS * float64(time.Second))}
	results := sideBySide(t, []int{base.N}, allContenders, o)
	printSideBySide(os.Stdout, results)
	kwok, _ := kwokOf(results, base.N)

	measured := map[string]map[string]float64{}
	for _, r := range results {
		if r.Contender != contenderKWOK && r.FloorOf == "" {
			measured[r.Contender] = keyFigures(r)
		}
	}
	if release := os.Getenv("BENCH_WRITE_BASELINE"); release != "" {
		base.Provisional = false
		base.Release, base.MeasuredOn, base.Figures = release, fmt.Sprintf("%s, load %s", time.Now().UTC().Format(time.DateOnly), kwok.LoadAvg), measured
		out, err := json.MarshalIndent(base, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote the baseline of %s to %s", release, path)
		return
	}
	var slower []string
	for contender, figures := range base.Figures {
		for name, want := range figures {
			got, ok := measured[contender][name]
			switch {
			case !ok:
				slower = append(slower, fmt.Sprintf("%s %s: not measured", contender, name))
			case got > want*regressionTolerance:
				slower = append(slower, fmt.Sprintf("%s %s: %.2f, baseline %.2f (+%.0f %%)", contender, name, got, want, (got/want-1)*100))
			default:
				t.Logf("%s %s: %.2f, baseline %.2f", contender, name, got, want)
			}
		}
	}
	if len(slower) > 0 && base.Provisional {
		t.Logf("the baseline is provisional (%s): not failing on these:\n  %s", base.MeasuredOn, strings.Join(slower, "\n  "))
		return
	}
	if len(slower) > 0 {
		t.Errorf("slower than the baseline of %s (%s) by more than %.0f %%:\n  %s",
			base.Release, path, (regressionTolerance-1)*100, strings.Join(slower, "\n  "))
	}
}
