package world

import (
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// terminationDone is when the simulated kubelet is done terminating a Pod
// that is being deleted, as a real kubelet would be: from when it saw the
// deletion (start), it runs every container's preStop hook (in parallel),
// then sends SIGTERM, and kills what is left when the Pod's grace period
// (deletionGracePeriodSeconds) ends. So the containers stop at start +
// min(longest preStop hook, grace period). A later delete with a shorter
// grace period shortens it, as it does for a kubelet.
//
// What the simulation knows of a hook's duration: a sleep action
// (lifecycle.preStop.sleep) and an exec hook that is a shell "sleep N" (what
// Karpenter's e2e pods use) take N seconds; any other hook is taken to
// return at once. Containers exit at once on SIGTERM (a process that
// ignores it would run until the grace period ends).
func terminationDone(pod *corev1.Pod, start time.Time) time.Time {
	grace := time.Duration(ptr.Deref(pod.DeletionGracePeriodSeconds, 0)) * time.Second
	hook := time.Duration(0)
	for _, c := range pod.Spec.Containers {
		if d := preStopDuration(c); d > hook {
			hook = d
		}
	}
	return start.Add(min(hook, grace))
}

// preStopDuration is how long a container's preStop hook runs.
func preStopDuration(c corev1.Container) time.Duration {
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil {
		return 0
	}
	h := c.Lifecycle.PreStop
	if h.Sleep != nil {
		return time.Duration(h.Sleep.Seconds) * time.Second
	}
	if h.Exec == nil || len(h.Exec.Command) == 0 {
		return 0
	}
	// "sleep N", or a shell running it: ["/bin/sh", "-c", "sleep N"].
	cmd := h.Exec.Command
	fields := cmd
	if len(cmd) >= 3 && (strings.HasSuffix(cmd[0], "sh")) && cmd[1] == "-c" {
		fields = strings.Fields(cmd[2])
	}
	if len(fields) == 2 && strings.HasSuffix(fields[0], "sleep") {
		if n, err := strconv.ParseFloat(fields[1], 64); err == nil && n > 0 {
			return time.Duration(n * float64(time.Second))
		}
	}
	return 0
}
