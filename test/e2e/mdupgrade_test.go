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

// Issue 35, upgrade in place: the provider of e402286 runs a pool and is
// killed (SIGKILL) in the middle of a burst, leaving its bookkeeping live on
// the MachineDeployment: reservations in flight, a held replica, released
// (marked) Machines whose replicas it already gave back. The MachineDeployment
// is paused meanwhile (Cluster API's paused annotation: its MachineSet does
// not act), so that all of it is still there when the new provider starts.
// The new binary starts on that state and the MachineDeployment resumes: it
// converges with no node lost or added and no NodeClaim stuck: NodeClaims
// == bound Machines == Nodes == pods (one per node), replicas == owned +
// others' (others' are 0 here), and no held-replicas or released-machines
// annotation left.
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

	// 1. Three nodes, then the MachineDeployment paused.
	d := deployment(t, name, "app-upgrade", 3, "1500m") // one per m5.large
	got := waitCounts(t, 4*time.Minute, name, "app-upgrade", mds, func(c counts) bool {
		return c.RunningPods == 3 && c.Initialized == 3 && c.BoundMachines == 3 && c.Replicas == 3
	})
	t.Logf("old provider: 3 pods on 3 nodes: %s", got)
	setPaused(t, key, true)
	t.Cleanup(func() { setPaused(t, key, false) })

	// 2. Two nodes emptied: core deletes their NodeClaims, the old provider
	// marks their Machines and gives back their replicas (released-machines).
	scaleDeployment(t, d, 1)
	if err := WaitFor(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		ann, err := annotationsOf(ctx, key)
		return err == nil && len(jsonList(ann[hub.ReleasedMachinesAnnotation])) >= 2, err
	}); err != nil {
		t.Fatalf("the old provider released no 2 Machines: %v", err)
	}

	// 3. Two more pods: their replicas are raised, and no Machine comes
	// (paused). One of the reservations ages past OrphanGrace, its pod
	// goes and its NodeClaim is deleted as core's launch timeout does: the
	// old provider holds its replica.
	scaleDeployment(t, d, 3)
	var reserved map[string]time.Time
	if err := WaitFor(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		_, pending, err := pendingOn(ctx, key)
		reserved = pending
		if err != nil || len(pending) < 2 {
			return false, err
		}
		for _, at := range pending {
			if time.Since(at) < machinedeployment.OrphanGrace+2*time.Second {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("no 2 reservations older than %s on %s: %v (%v)", machinedeployment.OrphanGrace, key, err, reserved)
	}
	scaleDeployment(t, d, 2)
	var gone string
	for claim := range reserved {
		gone = claim
		break
	}
	if err := w.Spoke.Client.Delete(ctx, &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: gone}}); client.IgnoreNotFound(err) != nil {
		t.Fatalf("deleting NodeClaim %s: %v", gone, err)
	}
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		ann, err := annotationsOf(ctx, key)
		return err == nil && strings.Contains(ann[machinedeployment.HeldReplicasAnnotation], gone), err
	}); err != nil {
		t.Fatalf("the old provider held no replica for NodeClaim %s: %v", gone, err)
	}

	// 4. A burst, and the old provider killed as its first raise lands.
	before, err := annotationsOf(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	scaleDeployment(t, d, 5)
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		ann, err := annotationsOf(ctx, key)
		return err == nil && ann[hub.PendingNodeClaimsAnnotation] != before[hub.PendingNodeClaimsAnnotation], err
	}); err != nil {
		t.Fatalf("the burst raised nothing: %v", err)
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
	marked := 0
	for _, m := range machines {
		if m.Annotations[clusterv1.DeleteMachineAnnotation] != "" {
			marked++
		}
	}
	t.Logf("left by the old provider: replicas %s, owned %s, %d reservations %s, held %s, released %s; %d Machines, %d marked",
		replicasOf(t, key), left[machinedeployment.OwnedReplicasAnnotation], len(pending), left[hub.PendingNodeClaimsAnnotation],
		left[machinedeployment.HeldReplicasAnnotation], left[hub.ReleasedMachinesAnnotation], len(machines), marked)
	if len(pending) == 0 || left[machinedeployment.HeldReplicasAnnotation] == "" || len(jsonList(left[hub.ReleasedMachinesAnnotation])) == 0 || marked == 0 {
		t.Fatalf("the old provider did not leave reservations, a held replica and released marked Machines behind")
	}
	// The node that runs a pod now must survive the upgrade.
	survivors := map[string]types.UID{}
	ncs := &karpv1.NodeClaimList{}
	if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: name}); err != nil {
		t.Fatal(err)
	}
	for _, nc := range ncs.Items {
		if nc.DeletionTimestamp.IsZero() && nc.Status.NodeName != "" {
			survivors[nc.Name] = nc.UID
		}
	}
	hubCache, _ := worldCaches(t)
	machinesMade := countMachinesMade(ctx, t, hubCache, md.Name)
	go func() { _ = hubCache.Start(ctx) }()
	hubCache.WaitForCacheSync(ctx)

	// 5. The new provider on that state; the MachineSet resumes.
	p, err := StartProvider(bin, w, "provider.log")
	if err != nil {
		t.Fatal(err)
	}
	provider = p
	start := time.Now()
	setPaused(t, key, false)
	got = waitCounts(t, 5*time.Minute, name, "app-upgrade", mds, func(c counts) bool {
		return c.RunningPods == 5 && c.PendingPods == 0 && c.NodeClaims == 5 && c.Initialized == 5 && c.Nodes == 5 &&
			c.Machines == 5 && c.BoundMachines == 5 && c.Replicas == 5 && c.Pending == 0
	})
	t.Logf("new provider: converged %s after its start: %s; %d Machines made since the kill", time.Since(start).Round(time.Second), got, machinesMade())
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
		t.Errorf("after the upgrade want owned-replicas 5 and no held-replicas or released-machines, have %v: %v", ann, err)
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
	// A Machine for each NodeClaim the old provider left without one, and
	// at most one for the held replica (made, then given back).
	if made, want := machinesMade(), 5-len(survivors); made < want || made > want+1 {
		t.Errorf("%d Machines made after the kill, want %d (one per NodeClaim without one) or one more for the held replica", made, want)
	}

	scaleDeployment(t, d, 0)
	waitCounts(t, 5*time.Minute, name, "app-upgrade", mds, func(c counts) bool {
		return c.NodeClaims == 0 && c.Machines == 0 && c.Replicas == 0
	})
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
