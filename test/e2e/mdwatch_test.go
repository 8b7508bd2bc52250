package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// Helpers of the MachineDeployment-mode acceptance scenarios (issue 35):
// the provider's log lines, and what the hub and spoke show over time.

// logLine is one JSON line of a provider log.
type logLine struct {
	Time    time.Time
	Message string
	Fields  map[string]any
	Raw     string
}

// logSize is a log file's size now: logLines(path, logSize(path)) reads
// only what is written from here on.
func logSize(t testing.TB, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// logLines reads the JSON lines of a provider log from the offset on whose
// message is one of messages (all lines when none is given).
func logLines(t testing.TB, path string, offset int64, messages ...string) []logLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, 0); err != nil {
		t.Fatal(err)
	}
	var out []logLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		raw := sc.Text()
		fields := map[string]any{}
		if json.Unmarshal([]byte(raw), &fields) != nil {
			continue
		}
		msg, _ := fields["message"].(string)
		if len(messages) > 0 && !oneOf(msg, messages) {
			continue
		}
		at, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(fields["time"]))
		out = append(out, logLine{Time: at, Message: msg, Fields: fields, Raw: raw})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func oneOf(s string, set []string) bool {
	for _, x := range set {
		if s == x {
			return true
		}
	}
	return false
}

// The provider's and core's log messages the scenarios read.
const (
	logReplicas  = "MachineDeployment replicas"                       // pkg/machinedeployment/writer.go
	logBound     = "bound Machine to NodeClaim"                       // pkg/machinedeployment/pass.go
	logLaunched  = "launched nodeclaim"                               // Karpenter core
	logReachable = "management cluster reachable again"               // pkg/hub/reachability.go
	logSyncStall = "cluster is waiting on sync for extended duration" // Karpenter core, every 10 s from 30 s on
)

// namesObject reports whether a logged object key (an object
// {"name","namespace"}, or "namespace/name") is the object's.
func namesObject(v any, namespace, name string) bool {
	switch key := v.(type) {
	case map[string]any:
		return key["name"] == name && key["namespace"] == namespace
	case string:
		return key == namespace+"/"+name
	}
	return false
}

// replicaLine is one "MachineDeployment replicas" line of a MachineDeployment.
type replicaLine struct {
	At       time.Time
	From, To int
	Changes  string
}

// replicaLines are the provider's replica log lines of a MachineDeployment
// from the offset on.
func replicaLines(t testing.TB, path string, offset int64, md *clusterv1.MachineDeployment) []replicaLine {
	t.Helper()
	var out []replicaLine
	for _, l := range logLines(t, path, offset, logReplicas) {
		if !namesObject(l.Fields["MachineDeployment"], md.Namespace, md.Name) {
			continue
		}
		from, _ := l.Fields["from"].(float64)
		to, _ := l.Fields["to"].(float64)
		changes, _ := l.Fields["changes"].(string)
		out = append(out, replicaLine{At: l.Time, From: int(from), To: int(to), Changes: changes})
	}
	return out
}

// checkReplicaChanges checks acceptance point 6 of issue 35 for the replica
// changes the provider made to md since the log offset: each is one info
// line and one ReplicasChanged event on the MachineDeployment, naming the
// NodeClaim(s) and the old and new replicas; and each NodeClaim in claims
// is named by a change. It returns the changes.
func checkReplicaChanges(t testing.TB, md *clusterv1.MachineDeployment, logPath string, offset int64, claims ...string) []replicaLine {
	t.Helper()
	var changes []replicaLine
	for _, l := range replicaLines(t, logPath, offset, md) {
		if l.From != l.To {
			changes = append(changes, l)
		}
	}
	if len(changes) == 0 {
		t.Fatalf("no replica change of MachineDeployment %s in the provider log", md.Name)
	}
	for _, l := range changes {
		if !strings.Contains(l.Changes, "NodeClaim ") {
			t.Errorf("replica change %d -> %d of %s names no NodeClaim: %q", l.From, l.To, md.Name, l.Changes)
		}
	}
	for _, c := range claims {
		named := false
		for _, l := range changes {
			named = named || strings.Contains(l.Changes, "NodeClaim "+c)
		}
		if !named {
			t.Errorf("no replica change of %s names NodeClaim %s", md.Name, c)
		}
	}
	// One event each, with the same text (events are recorded asynchronously).
	var missing []string
	err := WaitFor(context.Background(), 30*time.Second, func(ctx context.Context) (bool, error) {
		events, err := mdEventMessages(ctx, md, "ReplicasChanged")
		if err != nil {
			return false, err
		}
		missing = nil
		total := 0
		for _, n := range events {
			total += n
		}
		for _, l := range changes {
			want := fmt.Sprintf("replicas %d -> %d: %s", l.From, l.To, l.Changes)
			found := false
			for msg := range events {
				if msg == want || strings.HasSuffix(msg, "…") && strings.HasPrefix(want, strings.TrimSuffix(msg, "…")) {
					found = true
				}
			}
			if !found {
				missing = append(missing, want)
			}
		}
		if len(missing) == 0 && total != len(changes) {
			missing = []string{fmt.Sprintf("%d ReplicasChanged events for %d logged changes", total, len(changes))}
		}
		return len(missing) == 0, nil
	})
	if err != nil {
		t.Errorf("replica changes of %s without their ReplicasChanged event: %v: %v", md.Name, missing, err)
	}
	for _, l := range changes {
		t.Logf("replica change of %s at %s: %d -> %d: %s", md.Name, l.At.Format("15:04:05.000"), l.From, l.To, l.Changes)
	}
	return changes
}

// mdEventMessages maps the messages of the hub's events with the reason on
// the MachineDeployment to their counts.
func mdEventMessages(ctx context.Context, md *clusterv1.MachineDeployment, reason string) (map[string]int, error) {
	events := &corev1.EventList{}
	if err := w.Hub.Client.List(ctx, events, client.InNamespace(md.Namespace)); err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, e := range events.Items {
		if e.Reason == reason && e.InvolvedObject.Kind == "MachineDeployment" && e.InvolvedObject.Name == md.Name {
			out[e.Message] += int(max(e.Count, 1))
		}
	}
	return out, nil
}

// scaleMachineDeployment sets a MachineDeployment's spec.replicas as a user
// does (kubectl scale): a write of that field alone.
func scaleMachineDeployment(t testing.TB, md *clusterv1.MachineDeployment, replicas int32) {
	t.Helper()
	ctx := context.Background()
	err := WaitFor(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
		cur := &clusterv1.MachineDeployment{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
			return false, err
		}
		patch := client.MergeFromWithOptions(cur.DeepCopy(), client.MergeFromWithOptimisticLock{})
		cur.Spec.Replicas = &replicas
		err := w.Hub.Client.Patch(ctx, cur, patch)
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("scaling MachineDeployment %s to %d: %v", md.Name, replicas, err)
	}
}

// mdWatch records, from its start, what happens to a MachineDeployment's
// Machines in the hub and to a pool's NodeClaims in the spoke, with the
// time the test saw each step.
type mdWatch struct {
	cancel context.CancelFunc
	mu     sync.Mutex
	// Machines: when seen created and when seen bound (to which NodeClaim).
	machineSeen  map[string]time.Time
	machineBound map[string]time.Time
	machineClaim map[string]string
	machinePID   map[string]time.Time
	machineGone  map[string]time.Time
	machineInfra map[string]string
	// Infrastructure machines (AWSMachines): when seen with a providerID
	// (the launch returns on it, before Cluster API copies it to the Machine).
	infraPID      map[string]time.Time
	nodeClaimSeen map[string]time.Time
	// NodeClaims: when seen with a providerID, and seen terminating.
	nodeClaimPID  map[string]time.Time
	nodeClaimTerm map[string]time.Time
	// badBinds are binds seen to a NodeClaim the watch had seen
	// terminating (or gone) more than a second before.
	badBinds []string
	synced   time.Time
}

// watchMachineDeployment starts an mdWatch of md's Machines and pool's NodeClaims.
func watchMachineDeployment(t testing.TB, md *clusterv1.MachineDeployment, pool string) *mdWatch {
	t.Helper()
	hubCache, spokeCache := worldCaches(t)
	mw := &mdWatch{
		machineSeen: map[string]time.Time{}, machineBound: map[string]time.Time{}, machineClaim: map[string]string{},
		machinePID: map[string]time.Time{}, machineGone: map[string]time.Time{}, nodeClaimSeen: map[string]time.Time{},
		machineInfra: map[string]string{}, infraPID: map[string]time.Time{},
		nodeClaimPID: map[string]time.Time{}, nodeClaimTerm: map[string]time.Time{},
	}
	ctx, cancel := context.WithCancel(context.Background())
	mw.cancel = cancel
	t.Cleanup(cancel)
	machine := func(o any) {
		m, ok := o.(*clusterv1.Machine)
		if !ok || m.Labels[clusterv1.MachineDeploymentNameLabel] != md.Name {
			return
		}
		now := time.Now()
		mw.mu.Lock()
		defer mw.mu.Unlock()
		if _, ok := mw.machineSeen[m.Name]; !ok {
			mw.machineSeen[m.Name] = now
		}
		mw.machineInfra[m.Name] = m.Spec.InfrastructureRef.Name
		if m.Spec.ProviderID != "" {
			if _, ok := mw.machinePID[m.Name]; !ok {
				mw.machinePID[m.Name] = now
			}
		}
		claim := m.Annotations[v1alpha1.NodeClaimAnnotation]
		if claim == "" || mw.machineClaim[m.Name] == claim {
			return
		}
		mw.machineClaim[m.Name], mw.machineBound[m.Name] = claim, now
		if term, ok := mw.nodeClaimTerm[claim]; ok && now.Sub(term) > time.Second {
			mw.badBinds = append(mw.badBinds, fmt.Sprintf("Machine %s bound to NodeClaim %s at %s, seen terminating since %s",
				m.Name, claim, now.Format("15:04:05.000"), term.Format("15:04:05.000")))
		}
	}
	nodeClaim := func(o any) {
		nc, ok := o.(*karpv1.NodeClaim)
		if !ok || nc.Labels[karpv1.NodePoolLabelKey] != pool {
			return
		}
		now := time.Now()
		mw.mu.Lock()
		defer mw.mu.Unlock()
		if _, ok := mw.nodeClaimSeen[nc.Name]; !ok {
			mw.nodeClaimSeen[nc.Name] = now
		}
		if nc.Status.ProviderID != "" {
			if _, ok := mw.nodeClaimPID[nc.Name]; !ok {
				mw.nodeClaimPID[nc.Name] = now
			}
		}
		if !nc.DeletionTimestamp.IsZero() {
			if _, ok := mw.nodeClaimTerm[nc.Name]; !ok {
				mw.nodeClaimTerm[nc.Name] = now
			}
		}
	}
	tomb := func(o any) any {
		if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
			return d.Obj
		}
		return o
	}
	infra := func(o any) {
		im, ok := o.(*infrav1.AWSMachine)
		if !ok || im.Spec.ProviderID == nil || *im.Spec.ProviderID == "" {
			return
		}
		mw.mu.Lock()
		defer mw.mu.Unlock()
		if _, ok := mw.infraPID[im.Name]; !ok {
			mw.infraPID[im.Name] = time.Now()
		}
	}
	handlers := map[client.Object]toolscache.ResourceEventHandlerFuncs{
		&infrav1.AWSMachine{}: {AddFunc: infra, UpdateFunc: func(_, o any) { infra(o) }},
		&clusterv1.Machine{}: {AddFunc: machine, UpdateFunc: func(_, o any) { machine(o) }, DeleteFunc: func(o any) {
			if m, ok := tomb(o).(*clusterv1.Machine); ok {
				mw.mu.Lock()
				mw.machineGone[m.Name] = time.Now()
				mw.mu.Unlock()
			}
		}},
		&karpv1.NodeClaim{}: {AddFunc: nodeClaim, UpdateFunc: func(_, o any) { nodeClaim(o) }, DeleteFunc: func(o any) {
			if nc, ok := tomb(o).(*karpv1.NodeClaim); ok {
				mw.mu.Lock()
				if _, ok := mw.nodeClaimTerm[nc.Name]; !ok {
					mw.nodeClaimTerm[nc.Name] = time.Now()
				}
				mw.mu.Unlock()
			}
		}},
	}
	for o, h := range handlers {
		c := hubCache
		if _, ok := o.(*karpv1.NodeClaim); ok {
			c = spokeCache
		}
		inf, err := c.GetInformer(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			t.Fatal(err)
		}
	}
	go func() { _ = hubCache.Start(ctx) }()
	go func() { _ = spokeCache.Start(ctx) }()
	if !hubCache.WaitForCacheSync(ctx) || !spokeCache.WaitForCacheSync(ctx) {
		t.Fatal("the watch did not sync")
	}
	mw.synced = time.Now()
	return mw
}

// bad returns the binds seen to terminating NodeClaims.
func (mw *mdWatch) bad() []string {
	mw.mu.Lock()
	defer mw.mu.Unlock()
	return append([]string(nil), mw.badBinds...)
}

// launchTimes returns, for each NodeClaim seen created after since, how long
// it took from creation to a providerID (0: none yet).
func (mw *mdWatch) launchTimes(since time.Time) map[string]time.Duration {
	mw.mu.Lock()
	defer mw.mu.Unlock()
	out := map[string]time.Duration{}
	for name, seen := range mw.nodeClaimSeen {
		if seen.Before(since) {
			continue
		}
		out[name] = 0
		if pid, ok := mw.nodeClaimPID[name]; ok {
			out[name] = pid.Sub(seen)
		}
	}
	return out
}

// boundTo returns the Machines seen bound to the NodeClaim.
func (mw *mdWatch) boundTo(claim string) []string {
	mw.mu.Lock()
	defer mw.mu.Unlock()
	var out []string
	for m, c := range mw.machineClaim {
		if c == claim {
			out = append(out, m)
		}
	}
	return out
}

// everBound reports whether the Machine was ever seen bound.
func (mw *mdWatch) everBound(machine string) (string, bool) {
	mw.mu.Lock()
	defer mw.mu.Unlock()
	c, ok := mw.machineClaim[machine]
	return c, ok
}

// machineTimes returns when a Machine was seen created and when it, or
// its infrastructure machine first, was seen with a providerID.
func (mw *mdWatch) machineTimes(name string) (created, providerID time.Time) {
	mw.mu.Lock()
	defer mw.mu.Unlock()
	providerID = mw.machinePID[name]
	if at, ok := mw.infraPID[mw.machineInfra[name]]; ok && (providerID.IsZero() || at.Before(providerID)) {
		providerID = at
	}
	return mw.machineSeen[name], providerID
}

// madeBesides counts the Machines the watch saw that are not among before.
func (mw *mdWatch) madeBesides(before []clusterv1.Machine) int {
	known := map[string]bool{}
	for _, m := range before {
		known[m.Name] = true
	}
	mw.mu.Lock()
	defer mw.mu.Unlock()
	n := 0
	for name := range mw.machineSeen {
		if !known[name] {
			n++
		}
	}
	return n
}
