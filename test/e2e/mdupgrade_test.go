package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// upgradeFrom is the commit of the design before issue 35's rework.
const upgradeFrom = "e402286"

// upgradeEnv turns on the upgrade scenario: building the old provider
// costs minutes on a cold cache (make test-upgrade sets it).
const upgradeEnv = "E2E_UPGRADE"

// buildProviderAt builds (or finds cached) the provider binary of a commit
// with hack/provider-at.sh.
func buildProviderAt(t testing.TB, commit string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(environment.RepoRoot(), "hack", "provider-at.sh"), commit)
	cmd.Dir = environment.RepoRoot()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("building the provider at %s: %v: %s", commit, err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// Issue 35, upgrade in place: the provider of e402286 runs a pool and
// leaves its bookkeeping live on the MachineDeployment, which is paused
// with its MachineSet meanwhile (Cluster API's paused annotation: the
// MachineSet neither makes nor removes Machines) so that all of it is there
// at once: a burst of three reservations in flight, one of them held (its
// NodeClaim deleted as core's launch timeout deletes it: held-replicas), and
// a released Machine (a running NodeClaim deleted: its Machine marked, its
// replica already given back: released-machines). The MachineDeployment
// resumes and the old provider is killed (SIGKILL) as the first Machine of
// the burst appears. The new binary starts on that state and converges with
// no node lost or added and no NodeClaim stuck: NodeClaims == bound Machines
// == Nodes == pods (one per node), replicas == owned + others' (others' are
// 0 here), no held-replicas or released-machines annotation left, and no
// more Machines made than the NodeClaims without one need (plus one for the
// held replica, which is given back).
func TestUpgradeInPlaceFromTheOldMachineDeploymentDesign(t *testing.T) {
	if os.Getenv(upgradeEnv) == "" {
		t.Skipf("set %s=1 to run the upgrade from %s (make test-upgrade): it builds the old provider", upgradeEnv, upgradeFrom)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	oldBin := buildProviderAt(t, upgradeFrom)

	const name = "upgrade"
	pool(t, name)
	md := machineDeployment(t, name, "upgrade-m5-large", "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	mds := []*clusterv1.MachineDeployment{md}
	key := client.ObjectKeyFromObject(md)

	// The old provider in place of the suite's.
	provider.Kill()
	old, err := StartProvider(oldBin, w, "provider-old.log")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		old.Kill()
		if provider.Exited() {
			p, err := StartProvider(bin, w, "provider.log")
			if err != nil {
				t.Fatal(err)
			}
			provider = p
		}
	})
	if err := waitNodePoolReady(ctx, name); err != nil {
		t.Fatalf("NodePool %s not ready: %v", name, err)
	}

	// 1. Three nodes, then the MachineDeployment and its MachineSet paused.
	d := deployment(t, name, "app-upgrade", 3, "1500m") // one per m5.large
	got := waitCounts(t, 4*time.Minute, name, "app-upgrade", mds, func(c counts) bool {
		return c.RunningPods == 3 && c.Initialized == 3 && c.BoundMachines == 3 && c.Replicas == 3
	})
	t.Logf("old provider: 3 pods on 3 nodes: %s", got)
	pause := func(paused bool) {
		if !paused {
			setMachineSetsPaused(t, md, false)
		}
		setPaused(t, key, paused)
		if paused {
			setMachineSetsPaused(t, md, true)
		}
	}
	pause(true)
	paused := true
	t.Cleanup(func() {
		if paused {
			pause(false)
		}
	})

	// 2. A burst of three: their replicas are raised, no Machine comes.
	scaleDeployment(t, d, 6)
	var reserved map[string]time.Time
	if err := WaitFor(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		_, pending, err := pendingOn(ctx, key)
		reserved = pending
		if err != nil || len(pending) < 3 {
			return false, err
		}
		for _, at := range pending {
			if time.Since(at) < machinedeployment.OrphanGrace+2*time.Second {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("no 3 reservations older than %s on %s: %v (%v)", machinedeployment.OrphanGrace, key, err, reserved)
	}

	// 3. One of them goes as core's launch timeout makes it go, with its
	// pod: the old provider holds its replica once the NodeClaim is gone
	// (its Create returns within the launch wait).
	scaleDeployment(t, d, 5)
	var gone string
	for claim := range reserved {
		gone = claim
		break
	}
	if err := w.Spoke.Client.Delete(ctx, &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: gone}}); client.IgnoreNotFound(err) != nil {
		t.Fatalf("deleting NodeClaim %s: %v", gone, err)
	}
	if err := WaitFor(ctx, machinedeployment.DefaultLaunchWait+time.Minute, func(ctx context.Context) (bool, error) {
		ann, err := annotationsOf(ctx, key)
		return err == nil && strings.Contains(ann[machinedeployment.HeldReplicasAnnotation], gone), err
	}); err != nil {
		t.Fatalf("the old provider held no replica for NodeClaim %s: %v", gone, err)
	}

	// 4. Someone deletes a running NodeClaim: the old provider marks its
	// Machine and gives its replica back (released-machines); the paused
	// MachineSet keeps the Machine. Its pod is evicted and waits.
	var victim string
	ncs := &karpv1.NodeClaimList{}
	if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: name}); err != nil {
		t.Fatal(err)
	}
	for _, nc := range ncs.Items {
		if nc.Status.ProviderID != "" && nc.DeletionTimestamp.IsZero() {
			victim = nc.Name
			break
		}
	}
	if err := w.Spoke.Client.Delete(ctx, &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: victim}}); err != nil {
		t.Fatalf("deleting NodeClaim %s: %v", victim, err)
	}
	if err := WaitFor(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		ann, err := annotationsOf(ctx, key)
		return err == nil && len(jsonList(ann[hub.ReleasedMachinesAnnotation])) >= 1, err
	}); err != nil {
		t.Fatalf("the old provider released no Machine for NodeClaim %s: %v", victim, err)
	}

	// 5. The MachineDeployment resumes: the MachineSet removes the released
	// Machine and makes Machines for the burst; the old provider is killed
	// as the first of them appears.
	existing, err := machinesOfMD(ctx, md)
	if err != nil {
		t.Fatal(err)
	}
	watch := watchMachineDeployment(t, md, name)
	machinesMade := func() int { return watch.madeBesides(existing) }
	pause(false)
	paused = false
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) { return machinesMade() > 0, nil }); err != nil {
		t.Fatalf("no Machine made for the burst: %v", err)
	}
	old.Kill()
	left, err := annotationsOf(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	_, pending, err := pendingOn(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	machines, err := machinesOfMD(ctx, md)
	if err != nil {
		t.Fatal(err)
	}
	marked, bound := 0, 0
	for _, m := range machines {
		if m.Annotations[clusterv1.DeleteMachineAnnotation] != "" {
			marked++
		}
		if m.Annotations[v1alpha1.NodeClaimAnnotation] != "" {
			bound++
		}
	}
	t.Logf("left by the old provider: replicas %s, owned %s, %d reservations %s, held %s, released %s; %d Machines, %d bound, %d marked",
		replicasOf(t, key), left[machinedeployment.OwnedReplicasAnnotation], len(pending), left[hub.PendingNodeClaimsAnnotation],
		left[machinedeployment.HeldReplicasAnnotation], left[hub.ReleasedMachinesAnnotation], len(machines), bound, marked)
	if len(pending) == 0 || left[machinedeployment.HeldReplicasAnnotation] == "" || len(jsonList(left[hub.ReleasedMachinesAnnotation])) == 0 {
		t.Fatalf("the old provider did not leave reservations in flight, a held replica and a released Machine behind")
	}
	// The node that runs a pod now must survive the upgrade.
	survivors := map[string]types.UID{}
	if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: name}); err != nil {
		t.Fatal(err)
	}
	for _, nc := range ncs.Items {
		if nc.DeletionTimestamp.IsZero() && nc.Status.NodeName != "" {
			survivors[nc.Name] = nc.UID
		}
	}

	// 6. The new provider on that state.
	p, err := StartProvider(bin, w, "provider.log")
	if err != nil {
		t.Fatal(err)
	}
	provider = p
	start := time.Now()
	got = waitCounts(t, 5*time.Minute, name, "app-upgrade", mds, func(c counts) bool {
		return c.RunningPods == 5 && c.PendingPods == 0 && c.NodeClaims == 5 && c.Initialized == 5 && c.Nodes == 5 &&
			c.Machines == 5 && c.BoundMachines == 5 && c.Replicas == 5 && c.Pending == 0
	})
	t.Logf("new provider: converged %s after its start: %s; %d Machines made since the MachineDeployment resumed", time.Since(start).Round(time.Second), got, machinesMade())
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		ann, err := annotationsOf(ctx, key)
		if err != nil {
			return false, err
		}
		_, held := ann[machinedeployment.HeldReplicasAnnotation]
		_, released := ann[hub.ReleasedMachinesAnnotation]
		return !held && !released && ann[machinedeployment.OwnedReplicasAnnotation] == "5", nil
	}); err != nil {
		ann, _ := annotationsOf(ctx, key)
		t.Errorf("after the upgrade want owned-replicas 5 (replicas 5, others' 0) and no held-replicas or released-machines, have %v: %v", ann, err)
	}
	// No NodeClaim stuck in termination, none lost.
	if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: name}); err != nil {
		t.Fatal(err)
	}
	live := map[string]types.UID{}
	for _, nc := range ncs.Items {
		if !nc.DeletionTimestamp.IsZero() {
			t.Errorf("NodeClaim %s still terminating after the upgrade", nc.Name)
		}
		live[nc.Name] = nc.UID
	}
	for name, uid := range survivors {
		if live[name] != uid {
			t.Errorf("NodeClaim %s, running a pod before the upgrade, is gone after it", name)
		}
	}
	// A Machine for each NodeClaim without one (the reservations left in
	// flight, the evicted pod's new NodeClaim), and at most one for the held
	// replica (made, then given back).
	if made, want := machinesMade(), 5-len(survivors); made < want || made > want+1 {
		t.Errorf("%d Machines made since the MachineDeployment resumed, want %d (one per NodeClaim without one) or one more for the held replica", made, want)
	}

	scaleDeployment(t, d, 0)
	waitCounts(t, 5*time.Minute, name, "app-upgrade", mds, func(c counts) bool {
		return c.NodeClaims == 0 && c.Machines == 0 && c.Replicas == 0
	})
}

// setMachineSetsPaused sets or removes Cluster API's paused annotation on
// the MachineSets of a MachineDeployment (a paused MachineDeployment still
// lets its MachineSet replace Machines up to the MachineSet's replicas).
func setMachineSetsPaused(t testing.TB, md *clusterv1.MachineDeployment, paused bool) {
	t.Helper()
	ctx := context.Background()
	sets := &clusterv1.MachineSetList{}
	if err := w.Hub.Client.List(ctx, sets, client.InNamespace(md.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
		t.Fatal(err)
	}
	for i := range sets.Items {
		if err := patchPaused(ctx, &sets.Items[i], paused); err != nil {
			t.Fatalf("pausing MachineSet %s (%v): %v", sets.Items[i].Name, paused, err)
		}
	}
}

// annotationsOf reads a MachineDeployment's annotations.
func annotationsOf(ctx context.Context, key client.ObjectKey) (map[string]string, error) {
	cur := &clusterv1.MachineDeployment{}
	if err := w.Hub.Client.Get(ctx, key, cur); err != nil {
		return nil, err
	}
	return cur.Annotations, nil
}

func replicasOf(t testing.TB, key client.ObjectKey) string {
	t.Helper()
	cur := &clusterv1.MachineDeployment{}
	if err := w.Hub.Client.Get(context.Background(), key, cur); err != nil || cur.Spec.Replicas == nil {
		return "?"
	}
	return fmt.Sprint(*cur.Spec.Replicas)
}

// jsonList parses a JSON list annotation (nil when empty or malformed).
func jsonList(raw string) []string {
	var out []string
	_ = json.Unmarshal([]byte(raw), &out)
	return out
}
