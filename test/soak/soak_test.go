//go:build soak

// Package soak runs the product for a long time under a random, seeded
// schedule of faults (make soak: 30 minutes; make soak-short: 10), with two
// provider replicas and leader election, one pool per mode, and checks its
// invariants all along and at the end. A failing seed is reproducible:
// `make soak SOAK_SEED=<seed>` replays the same schedule (the timing of the
// world itself varies).
package soak

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/autonode/karpenter-clusterapi/test/e2e"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

var (
	duration = flag.Duration("soak.duration", 30*time.Minute, "how long faults are injected")
	seed     = flag.Int64("soak.seed", 0, "seed of the fault schedule (0: from the clock)")
)

// Bounds of the invariants.
const (
	// pendingBound is how long a pod may stay pending once nothing stops
	// launches (no outage, a leader running, the offerings it needs available).
	pendingBound = 4 * time.Minute
	// settleBound is how long the pools may take to settle once faults stop.
	settleBound = 6 * time.Minute
	// rssGrowth is how much a replica's RSS may grow between 2 minutes
	// after it first led and the end, for replicas that ran 10 minutes or
	// more from then.
	rssGrowth = 1.5
	// excessTolerance is how long a pool may have more live Machines than
	// NodeClaims (see ha.Sampler.Tolerance), counted from when the provider
	// could last act again (an outage's end, a replica beginning to lead):
	// the provider's OrphanGrace (30 s) for giving a spare replica back,
	// plus 10 s for the MachineSet to remove the Machine. The first 30-minute run (seed
	// 1795701443152048057) held a Machine kept for 23 minutes; the run
	// after the fix, excesses of 2-8 s.
	excessTolerance = 40 * time.Second
)

func TestSoak(t *testing.T) {
	ctrl.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	if *seed == 0 {
		*seed = time.Now().UnixNano()
	}
	t.Logf("SOAK seed=%d duration=%s (reproduce: make soak SOAK_SEED=%d SOAK_DURATION=%s)", *seed, *duration, *seed, *duration)
	rng := rand.New(rand.NewSource(*seed))
	ctx := context.Background()

	dir := t.TempDir()
	bin, err := e2e.BuildProvider(dir)
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	w, err := world.Start(sctx, world.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			w.KeepDir = true
			t.Logf("logs in %s", w.Dir)
		}
		_ = w.Stop()
	}()
	s, err := newSoak(ctx, t, w, bin, rng)
	if err != nil {
		t.Fatal(err)
	}
	defer s.rs.Stop()
	s.run(ctx, *duration)
	s.report()
}

// fatalf ends the soak with the seed in the message.
func (s *soak) fatalf(format string, args ...any) {
	s.t.Helper()
	s.t.Fatalf("seed %d: %s", *seed, fmt.Sprintf(format, args...))
}
