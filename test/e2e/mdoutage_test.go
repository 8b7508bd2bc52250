package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// shortHubOutage is the outage of the held-out runs of issue 35.
const shortHubOutage = 60 * time.Second

// providerStepsAfterOutage bounds the provider's own steps for a pod that
// waited through a hub outage (raise, bind, launch), from the hub's return.
const providerStepsAfterOutage = 5 * time.Second

// Issue 35, hub outage: a pod goes pending while the hub's API server is
// down for 60 s. From the hub's return, the provider's own steps for it
// take at most 5 s in all: raising the replica, binding the Machine the
// MachineSet makes, and returning the launch once the Machine has its
// providerID. Cluster API's time (making the Machine, provisioning it) is
// measured and logged separately. The provider's steps are read from its
// log lines (MachineDeployment replicas, bound Machine to NodeClaim, core's
// launched nodeclaim); Cluster API's from a watch of the hub started at its
// return. On e402286 the Machine was bound 62 s after the hub returned and
// the provider logged no raise at all.
func TestHubOutageProviderStepsWithinFiveSeconds(t *testing.T) {
	ctx := context.Background()
	const name = "hubback"
	pool(t, name)
	md := machineDeployment(t, name, "hubback-m5-large", "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	mds := []*clusterv1.MachineDeployment{md}
	if err := waitNodePoolReady(ctx, name); err != nil {
		t.Fatalf("NodePool %s not ready: %v", name, err)
	}
	// The provider knows the MachineDeployment's Machines (none) and its
	// offering before the outage.
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		nc := &v1alpha1.ClusterAPINodeClass{}
		if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: name}, nc); err != nil {
			return false, err
		}
		return nc.StatusConditions().Root().IsTrue(), nil
	}); err != nil {
		t.Fatalf("NodeClass %s not ready: %v", name, err)
	}
	logFrom := logSize(t, provider.LogPath)

	down, startHub := stopHub(t)
	d := deployment(t, name, "app-hubback", 1, "1500m")
	// The pod waits through the outage; the provider must keep running.
	for time.Since(down) < shortHubOutage {
		time.Sleep(min(5*time.Second, shortHubOutage-time.Since(down)))
		if provider.Exited() {
			t.Fatalf("the provider exited during the hub outage (log %s)", provider.LogPath)
		}
	}
	c, err := spokeCounts(ctx, name, "app-hubback")
	if err != nil {
		t.Fatal(err)
	}
	if c.PendingPods != 1 || c.RunningPods != 0 {
		t.Fatalf("during the outage want the pod pending, got %s", c)
	}
	t.Logf("after %s without hub: %s", time.Since(down).Round(time.Second), c)

	startHub(ctx)
	back := time.Now()
	// A watch of the hub from its return: when the Machine appears and
	// when Cluster API gives it its providerID.
	watch := watchMachineDeployment(t, md, name)
	t.Logf("hub API server back after %s down; watch synced %s later", back.Sub(down).Round(time.Second), watch.synced.Sub(back).Round(time.Millisecond))

	got := waitCounts(t, 3*time.Minute, name, "app-hubback", mds, func(c counts) bool {
		return c.RunningPods == 1 && c.Initialized == 1 && c.BoundMachines == 1
	})
	t.Logf("the pod runs %s after the hub's return: %s", time.Since(back).Round(100*time.Millisecond), got)

	// The NodeClaim that launched, its Machine, and the log lines.
	claims := nodeClaimNames(t, name)
	if len(claims) != 1 {
		t.Fatalf("want 1 NodeClaim, have %v", claims)
	}
	claim := claims[0]
	machines := watch.boundTo(claim)
	if len(machines) != 1 {
		t.Fatalf("NodeClaim %s: want 1 bound Machine, saw %v", claim, machines)
	}
	machine := machines[0]
	mCreated, mProviderID := watch.machineTimes(machine)
	if mCreated.Before(watch.synced) {
		// Listed at the watch's start: the server's creation time.
		m := &clusterv1.Machine{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: md.Namespace, Name: machine}, m); err != nil {
			t.Fatal(err)
		}
		mCreated = m.CreationTimestamp.Time
	}
	var reachable, raised, bound, launched time.Time
	for _, l := range logLines(t, provider.LogPath, logFrom, logReachable, logReplicas, logBound, logLaunched) {
		switch {
		case l.Message == logReachable && reachable.IsZero() && !l.Time.Before(down):
			reachable = l.Time
		case l.Message == logReplicas && raised.IsZero() && namesObject(l.Fields["MachineDeployment"], md.Namespace, md.Name) &&
			strings.Contains(fieldString(l, "changes"), "raised for NodeClaim "+claim):
			raised = l.Time
		case l.Message == logBound && bound.IsZero() && fieldString(l, "NodeClaim") == claim:
			bound = l.Time
		case l.Message == logLaunched && launched.IsZero() && strings.Contains(l.Raw, `"`+claim+`"`):
			launched = l.Time
		}
	}
	for what, at := range map[string]time.Time{"management cluster reachable again": reachable, "the raise": raised, "the bind": bound,
		"launched nodeclaim": launched, "the Machine's creation": mCreated, "the Machine's providerID": mProviderID} {
		if at.IsZero() {
			t.Fatalf("no time for %s of NodeClaim %s (Machine %s) in the provider log %s or the hub", what, claim, machine, provider.LogPath)
		}
	}
	// The provider's part: from the hub's return to the raise, from the
	// Machine's creation to the bind, from its providerID to the launch's
	// return. Cluster API's part: from the raise to the Machine, from the
	// bind to the providerID.
	pos := func(d time.Duration) time.Duration { return max(d, 0) }
	toRaise, toBind, toLaunch := pos(raised.Sub(back)), pos(bound.Sub(mCreated)), pos(launched.Sub(mProviderID))
	providers := toRaise + toBind + toLaunch
	capiMachine, capiProvision := pos(mCreated.Sub(raised)), pos(mProviderID.Sub(later(bound, mCreated)))
	t.Logf("after the hub's return: reachable logged after %s; provider: raise %s, bind %s after the Machine, launch %s after its providerID = %s; Cluster API: Machine %s after the raise, providerID %s later = %s",
		reachable.Sub(back).Round(time.Millisecond), toRaise.Round(time.Millisecond), toBind.Round(time.Millisecond), toLaunch.Round(time.Millisecond),
		providers.Round(time.Millisecond), capiMachine.Round(time.Millisecond), capiProvision.Round(time.Millisecond), (capiMachine + capiProvision).Round(time.Millisecond))
	if providers > providerStepsAfterOutage {
		t.Errorf("the provider's own steps took %s after the hub's return, want at most %s (raise %s, bind %s, launch %s)",
			providers.Round(time.Millisecond), providerStepsAfterOutage, toRaise, toBind, toLaunch)
	}

	scaleDeployment(t, d, 0)
	waitCounts(t, 4*time.Minute, name, "app-hubback", mds, func(c counts) bool {
		return c.NodeClaims == 0 && c.Machines == 0 && c.Replicas == 0
	})
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// fieldString is a log line's string field.
func fieldString(l logLine, key string) string {
	s, _ := l.Fields[key].(string)
	return s
}
