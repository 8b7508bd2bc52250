package model

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
)

// launchReturnWithin bounds how long, in real time, a Launch may take to
// return once its NodeClaim's deletion was reported. It returns at the
// next look (milliseconds); the bound only keeps a broken Launch from
// hanging the test.
const launchReturnWithin = 10 * time.Second

// The stall of conformance run conf-snc3 (regression/StandaloneNodeClaim,
// "should delete a NodeClaim if it references a NodeClass that isn't
// Ready", MachineDeployment mode): a NodeClaim deleted while its Create
// waits for a Machine. The pass rightly binds no Machine to a terminating
// NodeClaim, so Launch had nothing left to wait for, yet it waited its
// whole LaunchWait (2 minutes); core finalizes a NodeClaim only once its
// Create returns, so the deletion, the reservation and the Machine made for
// it (booted, reported as unowned) were all held that long. Launch returns
// as soon as the NodeClaim's deletion is seen, and the replica and its
// Machine are given back once the NodeClaim is gone.
func TestLaunchStopsWaitingWhenItsNodeClaimIsDeleted(t *testing.T) {
	w := newWorld(t, map[string]int32{"cheap": 0, "dear": 0}, nil, nil)
	w.reconcile() // the provider has counted its (no) replicas
	claim := w.newClaim()

	// Core's Create, with a LaunchWait that never ends on its own.
	never := make(chan time.Time)
	w.provider.SetLaunchTimer(func(time.Duration) <-chan time.Time { return never })
	returned := w.reserve(t, context.Background(), claim)

	// Someone deletes the NodeClaim while its Create waits: its finalizer
	// holds it (core removes that only after Create returns), and the
	// provider's NodeClaim watch reports the deletion.
	w.startDeleting(claim)
	// Meanwhile the MachineSet makes the Machine for the raise and the
	// instance boots with Karpenter's unregistered taint, as in the run.
	w.runMachineSets()
	w.reconcile()
	w.runInfrastructure()
	w.runInfrastructure()
	w.reconcile()
	if m := w.machineOf(claim); m != nil {
		t.Errorf("Machine %s bound to NodeClaim %s, which is being deleted", m.Name, claim)
	}

	var err error
	select {
	case err = <-returned:
	case <-time.After(launchReturnWithin):
		close(never) // let the Launch end, then fail
		err = <-returned
		t.Fatalf("Launch of NodeClaim %s still waiting %s after the NodeClaim's deletion was reported; it returned only at its LaunchWait: %v",
			claim, launchReturnWithin, err)
	}
	switch {
	case err == nil:
		t.Fatalf("Launch of NodeClaim %s, which is being deleted, succeeded", claim)
	case errors.Is(err, machinedeployment.ErrStillLaunching):
		t.Fatalf("Launch of NodeClaim %s returned %q: its LaunchWait ended, not its wait for a NodeClaim being deleted", claim, err)
	case !strings.Contains(err.Error(), claim):
		t.Errorf("Launch's error %q does not name NodeClaim %s", err, claim)
	}

	// Create returned: core's finalizer lets the NodeClaim go (no
	// providerID, so no Delete), and the replica raised for it and the
	// Machine made for that replica are given back.
	w.timeOut(claim)
	w.settle()
	if got, live := w.replicas("cheap"), w.liveMachines("cheap"); got != 0 || live != 0 {
		t.Errorf("cheap holds %d replicas and %d live Machines once the NodeClaim is gone, want 0 and 0", got, live)
	}
	w.noFailures(t)
}

// waitFor waits until cond holds, failing after launchReturnWithin or when
// the Launch returned first (with its error).
func waitFor(t *testing.T, what string, cond func() bool, returned <-chan error) {
	t.Helper()
	deadline := time.After(launchReturnWithin)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case err := <-returned:
			t.Fatalf("Launch returned before %s: %v", what, err)
		case <-deadline:
			t.Fatalf("no %s within %s", what, launchReturnWithin)
		case <-tick.C:
		}
	}
}
