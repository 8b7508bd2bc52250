package main

import (
	"context"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/test/world"
)

// step is one stage of the workload loop. It lasts at least minimum (scale
// downs leave Karpenter time to consolidate), and ends once the fleet has
// been settled for settleFor, or after maxStep in any case.
type step struct {
	// md and machines are the replicas of the MachineDeployment-mode and
	// the Machine-mode workload.
	md, machines int32
	// spotExhausted makes the simulated AWS refuse spot launches
	// (InsufficientInstanceCapacity) during the step.
	spotExhausted bool
	why           string
	minimum       time.Duration
}

func (s step) replicas() int32 { return s.md + s.machines }

// steps repeat until Ctrl-C. Each pod asks for 1 CPU.
var steps = []step{
	{6, 4, false, "new nodes: MachineDeployment replicas (MD) and standalone spot Machines (Machine)", 30 * time.Second},
	{14, 8, true, "more nodes; spot is exhausted in the simulated AWS: Machine mode falls back to on-demand", 30 * time.Second},
	{3, 2, false, "spot is back; consolidation: fewer, cheaper nodes (on-demand replaced by spot)", 100 * time.Second},
	{0, 0, false, "empty nodes are removed", 60 * time.Second},
}

const (
	settleFor = 10 * time.Second
	maxStep   = 3 * time.Minute
)

// scaleLoop scales the workload through steps, over and over.
func (d *demo) scaleLoop(ctx context.Context) {
	for i := 0; ; i = (i + 1) % len(steps) {
		st := steps[i]
		if st.spotExhausted != d.spotExhausted {
			d.w.AWS.SetInsufficientCapacity("", "", world.CapacityTypeSpot, st.spotExhausted)
			d.spotExhausted = st.spotExhausted
			if st.spotExhausted {
				d.events.add("simulated AWS: spot capacity exhausted everywhere (launches fail with InsufficientInstanceCapacity)")
			} else {
				d.events.add("simulated AWS: spot capacity is back")
			}
		}
		err := d.scale(ctx, workloadName, st.md)
		if err == nil {
			err = d.scale(ctx, machinesWorkload, st.machines)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d.events.add("scaling the workloads: %v", err)
		} else {
			d.events.add("workloads scaled to %d (MD) + %d (Machine) replicas: %s", st.md, st.machines, st.why)
		}
		if !d.hold(ctx, st) {
			return
		}
	}
}

// hold waits until the step is over; false when ctx ended.
func (d *demo) hold(ctx context.Context, st step) bool {
	start := time.Now()
	var settledSince time.Time
	for {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Second):
		}
		if s := d.latest.Load(); s == nil || s.Replicas != st.replicas() || !s.Settled() {
			settledSince = time.Time{}
		} else if settledSince.IsZero() {
			settledSince = time.Now()
		}
		age := time.Since(start)
		if age >= maxStep || (age >= st.minimum && !settledSince.IsZero() && time.Since(settledSince) >= settleFor) {
			return true
		}
	}
}

func (d *demo) scale(ctx context.Context, name string, replicas int32) error {
	dep := &appsv1.Deployment{}
	if err := d.w.Spoke.Client.Get(ctx, client.ObjectKey{Namespace: workloadNamespace, Name: name}, dep); err != nil {
		return err
	}
	patch := client.MergeFrom(dep.DeepCopy())
	dep.Spec.Replicas = &replicas
	return d.w.Spoke.Client.Patch(ctx, dep, patch)
}
