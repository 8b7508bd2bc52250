package main

import (
	"context"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// step is one stage of the workload loop. It lasts at least minimum (scale
// downs leave Karpenter time to consolidate), and ends once the fleet has
// been settled for settleFor, or after maxStep in any case.
type step struct {
	replicas int32
	why      string
	minimum  time.Duration
}

// steps repeat until Ctrl-C. Each pod asks for 1 CPU.
var steps = []step{
	{6, "new nodes for 6 pods", 30 * time.Second},
	{14, "more nodes for 14 pods", 30 * time.Second},
	{3, "consolidation: fewer, cheaper nodes for 3 pods", 100 * time.Second},
	{0, "empty nodes are removed", 60 * time.Second},
}

const (
	settleFor = 10 * time.Second
	maxStep   = 3 * time.Minute
)

// scaleLoop scales the workload through steps, over and over.
func (d *demo) scaleLoop(ctx context.Context) {
	for i := 0; ; i = (i + 1) % len(steps) {
		st := steps[i]
		if err := d.scale(ctx, st.replicas); err != nil {
			if ctx.Err() != nil {
				return
			}
			d.events.add("scaling the workload: %v", err)
		} else {
			d.events.add("workload %s scaled to %d replicas: %s", workloadName, st.replicas, st.why)
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
		if s := d.latest.Load(); s == nil || s.Replicas != st.replicas || !s.Settled() {
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

func (d *demo) scale(ctx context.Context, replicas int32) error {
	dep := &appsv1.Deployment{}
	if err := d.w.Spoke.Client.Get(ctx, client.ObjectKey{Namespace: workloadNamespace, Name: workloadName}, dep); err != nil {
		return err
	}
	patch := client.MergeFrom(dep.DeepCopy())
	dep.Spec.Replicas = &replicas
	return d.w.Spoke.Client.Patch(ctx, dep, patch)
}
