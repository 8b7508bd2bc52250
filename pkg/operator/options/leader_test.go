package options

import (
	"flag"
	"io"
	"testing"
	"time"

	coreoptions "sigs.k8s.io/karpenter/pkg/operator/options"
)

// parse parses args as core's injection does: every injectable's flags on
// one flag set, then each parses in order (core's first).
func parse(t *testing.T, args ...string) (*Options, *coreoptions.Options) {
	t.Helper()
	fs := &coreoptions.FlagSet{FlagSet: flag.NewFlagSet("karpenter", flag.ContinueOnError)}
	fs.SetOutput(io.Discard)
	core, ours := &coreoptions.Options{}, &Options{}
	saved := coreoptions.Injectables
	coreoptions.Injectables = []coreoptions.Injectable{core, ours}
	t.Cleanup(func() { coreoptions.Injectables = saved })
	for _, o := range coreoptions.Injectables {
		o.AddFlags(fs)
	}
	for _, o := range coreoptions.Injectables {
		if err := o.Parse(fs, args...); err != nil {
			t.Fatalf("parsing %v: %v", args, err)
		}
	}
	return ours, core
}

// The provider runs the election itself: core's is always off, and the
// user's choice (flag or environment) and Lease name and namespace carry
// over, with the provider's timings.
func TestLeaderElectionTakesOverCoresSettings(t *testing.T) {
	ours, core := parse(t, "--leader-election-name=my-lease", "--leader-election-namespace=ns",
		"--leader-election-lease-duration=15s", "--leader-election-renew-deadline=10s", "--leader-election-retry-period=2s")
	if !core.DisableLeaderElection {
		t.Error("core's own leader election is still on")
	}
	le := ours.LeaderElection
	if !le.Enabled || le.Name != "my-lease" || le.Namespace != "ns" || le.LeaseDuration != 15*time.Second || le.RenewDeadline != 10*time.Second || le.RetryPeriod != 2*time.Second {
		t.Errorf("leader election settings %+v", le)
	}

	ours, _ = parse(t, "--disable-leader-election=true")
	if ours.LeaderElection.Enabled {
		t.Error("--disable-leader-election=true left the provider's election on")
	}
	t.Setenv("DISABLE_LEADER_ELECTION", "true")
	ours, _ = parse(t)
	if ours.LeaderElection.Enabled {
		t.Error("DISABLE_LEADER_ELECTION=true left the provider's election on")
	}
	// A second parse (core parses again for every runnable's context) reads
	// the user's choice again, not the forced value.
	t.Setenv("DISABLE_LEADER_ELECTION", "false")
	ours, _ = parse(t)
	if !ours.LeaderElection.Enabled {
		t.Error("the election is off though the user did not disable it")
	}
}

func TestLeaderElectionTimingsAreValidated(t *testing.T) {
	fs := &coreoptions.FlagSet{FlagSet: flag.NewFlagSet("karpenter", flag.ContinueOnError)}
	fs.SetOutput(io.Discard)
	core, ours := &coreoptions.Options{}, &Options{}
	saved := coreoptions.Injectables
	coreoptions.Injectables = []coreoptions.Injectable{core, ours}
	t.Cleanup(func() { coreoptions.Injectables = saved })
	core.AddFlags(fs)
	ours.AddFlags(fs)
	args := []string{"--leader-election-lease-duration=5s", "--leader-election-renew-deadline=6s"}
	if err := core.Parse(fs, args...); err != nil {
		t.Fatal(err)
	}
	if err := ours.Parse(fs, args...); err == nil {
		t.Error("a lease not longer than the renew deadline was accepted")
	}
}
