package e2eha

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/test/e2e"
	"github.com/autonode/karpenter-clusterapi/test/ha"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// takeoverTarget is the longest a crashed leader should leave launches
// waiting (kill -> the new leader's first launch step): the figure is
// printed against it (docs/ha.md collects the runs). A run fails only past
// takeoverBound: on a 2-core machine running other test worlds beside it
// the same takeover measured 9-15.4 s, so a tighter bound would fail on
// load rather than on the product.
const (
	takeoverTarget = 15 * time.Second
	takeoverBound  = 30 * time.Second
)

// launchKinds are the hub writes of a launch step in each mode: the
// provider creates Machines itself in Machine mode; in MachineDeployment
// mode it raises replicas and binds the Machine Cluster API's MachineSet
// made for a raised replica to its NodeClaim. A new leader's first step on
// the launches the old one left in flight is a binding: Cluster API made
// their Machines meanwhile. (Its first raise for pods that arrived after the
// kill comes only once every NodeClaim in flight has a providerID: Karpenter
// core does not provision while a NodeClaim lacks one.)
var launchKinds = map[ha.Mode][]string{ha.MachineMode: {"MachineCreated"}, ha.MachineDeploymentMode: {"ReplicasRaised", "MachineBound"}}

// The leader dies (SIGKILL: a lost node, an OOM kill) in the middle of a
// burst, with launches and terminations in flight. The other replica takes
// over: it knows nothing the first one knew in memory, only what the
// clusters hold. At the end there are exactly as many Machines, Nodes and
// NodeClaims as pods need (20), at no moment more Machines than NodeClaims,
// no unbound Machine, and the new leader launched within takeoverTarget of
// the kill.
func TestLeaderFailoverMidBurst(t *testing.T) {
	for _, mode := range []ha.Mode{ha.MachineMode, ha.MachineDeploymentMode} {
		t.Run(string(mode), func(t *testing.T) { testFailover(t, mode) })
	}
}

func testFailover(t *testing.T, mode ha.Mode) {
	ctx := context.Background()
	name := map[ha.Mode]string{ha.MachineMode: "fo-m", ha.MachineDeploymentMode: "fo-md"}[mode]
	old := name + "-old"
	rs, leader := replicas(t)
	pool(t, name, ha.PoolOptions{Mode: mode})
	// A budget of one node: the old nodes are terminated one after the
	// other, so terminations are in flight for a while.
	pool(t, old, ha.PoolOptions{Mode: mode, Budget: "1"})
	// Instances take 5 s to run (the world's default: 1 s): launches stay in
	// flight for a while too.
	w.AWS.SetProvisionDelay(5 * time.Second)
	t.Cleanup(func() { w.AWS.SetProvisionDelay(world.DefaultProvisionDelay) })

	// Nodes to terminate during the burst.
	oldApp := app(t, old, "app-"+old, 3)
	start := time.Now()
	waitCounts(t, 4*time.Minute, old, "app-"+old, func(c ha.Counts) bool { return c.RunningPods == 3 && c.Settled(3) })
	t.Logf("%s: 3 nodes to terminate later are up after %s", mode, time.Since(start).Round(time.Second))

	watch, err := ha.WatchHub(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()
	sampler := ha.Sample(w, 500*time.Millisecond, name, old)

	// The old nodes empty out; consolidation terminates them one by one
	// (about 10 s each).
	scale(t, oldApp, 0)
	if err := e2e.WaitFor(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		o, err := ha.Count(ctx, w, old, "")
		return err == nil && o.NodeClaimsDeleting > 0, err
	}); err != nil {
		t.Fatalf("no termination began: %v", err)
	}
	// The burst: 16 pods need new nodes at once.
	burst := app(t, name, "app-"+name, 16)
	if err := e2e.WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		n, err := ha.Count(ctx, w, name, "")
		return err == nil && n.NodeClaims > 0, err
	}); err != nil {
		t.Fatalf("no launch began: %v", err)
	}
	o, _ := ha.Count(ctx, w, old, "")
	n, _ := ha.Count(ctx, w, name, "")
	killed := rs.Provider(leader)
	kill := time.Now()
	rs.Kill(leader)
	t.Logf("%s: leader replica-%d killed (SIGKILL) with old pool %s; new pool %s", mode, leader, o, n)
	if o.NodeClaimsDeleting == 0 || n.Nodes >= 16 {
		t.Fatalf("launches and terminations were not both in flight at the kill")
	}
	// Four more pods right after the kill: their nodes can only be launched
	// by the next leader.
	scale(t, burst, 20)

	next, _, err := rs.WaitLeader(ctx, time.Minute, -1)
	if err != nil {
		t.Fatal(err)
	}
	if rs.Provider(next) == killed {
		t.Fatalf("the killed replica still reports leading")
	}
	leading := time.Since(kill)

	final := waitCounts(t, 5*time.Minute, name, "app-"+name, func(c ha.Counts) bool { return c.RunningPods == 20 && c.Settled(20) })
	// A node launched across the failover is like any other: not drifted.
	checkNotDrifted(t, name)
	waitCounts(t, 3*time.Minute, old, "", func(c ha.Counts) bool { return c.Settled(0) })
	samples, violations := sampler.Stop()

	// Writes of the dead leader still on the wire land within milliseconds.
	launch, ok := watch.First(kill.Add(300*time.Millisecond), name, launchKinds[mode]...)
	if !ok {
		t.Fatalf("no launch (%s) in pool %s after the kill", launchKinds[mode], name)
	}
	takeover := launch.At.Sub(kill)
	created, _ := watch.First(kill.Add(300*time.Millisecond), name, "MachineCreated")
	t.Logf("HA-FIGURE failover mode=%s kill->leading=%s kill->first-launch-step=%s (%s) kill->first-Machine-created=%s samples=%d final: %s",
		mode, leading.Round(100*time.Millisecond), takeover.Round(100*time.Millisecond), launch,
		created.At.Sub(kill).Round(100*time.Millisecond), samples, final)
	for _, v := range violations {
		t.Errorf("more Machines than NodeClaims: %s", v)
	}
	if takeover > takeoverTarget {
		t.Logf("HA-FIGURE %s: the new leader launched %s after the kill, over the %s target", mode, takeover.Round(100*time.Millisecond), takeoverTarget)
	}
	if takeover > takeoverBound {
		t.Errorf("%s: the new leader launched %s after the kill, want within %s", mode, takeover.Round(100*time.Millisecond), takeoverBound)
	}
	// Nothing the clusters did not need: no Machine created and deleted
	// again in the new pool.
	if del := watch.Events(kill, "MachineDeleting", "MachineDeleted"); len(del) > 0 {
		for _, e := range del {
			if e.Pool == name {
				t.Errorf("a Machine of the burst was deleted: %s", e)
			}
		}
	}

}

// The leader stops gracefully (SIGTERM: a rolling update, a drain): it
// releases the Lease as it exits, and the other replica leads and launches
// within 3 s.
func TestGracefulHandover(t *testing.T) {
	ctx := context.Background()
	const name = "handover"
	rs, leader := replicas(t)
	pool(t, name, ha.PoolOptions{Mode: ha.MachineMode})
	d := app(t, name, "app-"+name, 2)
	waitCounts(t, 3*time.Minute, name, "app-"+name, func(c ha.Counts) bool { return c.RunningPods == 2 && c.Settled(2) })
	watch, err := ha.WatchHub(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()

	old := rs.Provider(leader)
	term := time.Now()
	// Pods that need a node while the leader goes.
	scale(t, d, 4)
	rs.Terminate(leader)
	exited := time.Since(term)
	next, _, err := rs.WaitLeader(ctx, 30*time.Second, -1)
	if err != nil {
		t.Fatal(err)
	}
	if rs.Provider(next) == old {
		t.Fatal("the stopped replica still reports leading")
	}
	leading := time.Since(term)
	waitCounts(t, 3*time.Minute, name, "app-"+name, func(c ha.Counts) bool { return c.RunningPods == 4 && c.Settled(4) })
	var firstByNext time.Duration
	for _, e := range watch.Events(term, "MachineCreated") {
		if e.Pool == name && e.At.After(term.Add(exited)) {
			firstByNext = e.At.Sub(term)
			break
		}
	}
	t.Logf("HA-FIGURE handover SIGTERM->exited=%s SIGTERM->leading=%s SIGTERM->first-launch-by-next=%s",
		exited.Round(10*time.Millisecond), leading.Round(10*time.Millisecond), firstByNext.Round(10*time.Millisecond))
	if leading > 3*time.Second {
		t.Errorf("the next replica leads %s after SIGTERM, want within 3s (was the Lease released?)", leading.Round(10*time.Millisecond))
		// What the stopped replica waited for (its log has the stacks).
		logs := rs.Logs()
		if data, err := os.ReadFile(logs[leader]); err == nil {
			for _, line := range strings.Split(string(data), "\n") {
				if strings.Contains(line, "still stopping") {
					t.Logf("replica %d: %.600s", leader, line)
				}
			}
		}
	}
}

// checkNotDrifted fails for every NodeClaim of the pool that Karpenter
// found drifted, with what it holds.
func checkNotDrifted(t *testing.T, pool string) {
	t.Helper()
	ncs := &karpv1.NodeClaimList{}
	if err := w.Spoke.Client.List(context.Background(), ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
		t.Fatal(err)
	}
	for _, nc := range ncs.Items {
		if c := nc.StatusConditions().Get(karpv1.ConditionTypeDrifted); c != nil && c.IsTrue() {
			t.Errorf("NodeClaim %s drifted (%s: %s): labels %v annotations %v requirements %v",
				nc.Name, c.Reason, c.Message, nc.Labels, nc.Annotations, nc.Spec.Requirements)
		}
	}
}
