package e2e

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// timeline records when the bench's watches first saw each object reach
// each stage of a launch, in this process's clock: pods created and
// Running, NodeClaims created, launched (status.providerID), registered and
// initialized, Nodes created and Ready, and on the hub Machines created,
// infrastructure machines with a providerID (the instance exists, still
// pending) and Machines with a providerID (Cluster API copies it once the
// instance runs). Each stage keeps its first time per object.
type timeline struct {
	mu     sync.Mutex
	stages map[string]map[string]time.Time // stage -> object -> first seen
	live   map[string]map[string]bool      // kind -> objects that exist now
	peak   map[string]int                  // kind -> most objects at once
	// ids are the providerIDs of the pool's instances (a floor's Nodes
	// carry no NodePool label: they are told by these).
	ids map[string]bool
	// zones are the failure domains of the pool's Machines: name -> zone.
	zones map[string]string
	// notDeleting are the Machines and NodeClaims that exist without a
	// deletionTimestamp; surplus is the most Machines beyond NodeClaims
	// among them seen while counting (countSurplus: the scale-up).
	notDeleting map[string]map[string]bool
	surplus     int
	surplusOn   bool
}

func newTimeline() *timeline {
	return &timeline{stages: map[string]map[string]time.Time{}, live: map[string]map[string]bool{}, peak: map[string]int{},
		ids: map[string]bool{}, zones: map[string]string{}, notDeleting: map[string]map[string]bool{}}
}

// countSurplus starts or stops recording Machines beyond NodeClaims: from
// the burst to the scale-down (whose NodeClaims go first, on purpose).
func (t *timeline) countSurplus(on bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.surplusOn = on
}

// surplusPeak is the most Machines (not deleting) beyond NodeClaims (not
// deleting) seen while counting.
func (t *timeline) surplusPeak() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.surplus
}

// deleting records whether one of the pool's Machines or NodeClaims is
// being deleted (gone: exists(kind, key, false)).
func (t *timeline) deleting(kind, key string, deleting bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.setNotDeleting(kind, key, !deleting)
}

func (t *timeline) setNotDeleting(kind, key string, on bool) {
	setMember(t.notDeleting, kind, key, on)
	if t.surplusOn {
		t.surplus = max(t.surplus, len(t.notDeleting["machine"])-len(t.notDeleting["nodeclaim"]))
	}
}

// instance records a providerID of one of the pool's instances.
func (t *timeline) instance(id string) {
	if id == "" {
		return
	}
	t.mu.Lock()
	t.ids[id] = true
	t.mu.Unlock()
}

// zoneCounts are the pool's Machines per failure domain: "zone=count ...".
func (t *timeline) zoneCounts() string {
	t.mu.Lock()
	by := map[string]int{}
	for _, z := range t.zones {
		by[z]++
	}
	t.mu.Unlock()
	keys := make([]string, 0, len(by))
	for z := range by {
		keys = append(keys, z)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, z := range keys {
		name := z
		if name == "" {
			name = "(none)"
		}
		parts = append(parts, fmt.Sprintf("%s=%d", name, by[z]))
	}
	return strings.Join(parts, " ")
}

func (t *timeline) mark(stage, key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := t.stages[stage]
	if m == nil {
		m = map[string]time.Time{}
		t.stages[stage] = m
	}
	if _, ok := m[key]; !ok {
		m[key] = time.Now()
	}
}

func (t *timeline) exists(kind, key string, present bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	setMember(t.live, kind, key, present)
	if !present {
		t.setNotDeleting(kind, key, false)
	}
	t.peak[kind] = max(t.peak[kind], len(t.live[kind]))
}

// count is how many objects reached a stage; now how many of a kind exist.
func (t *timeline) count(stage string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.stages[stage])
}

func (t *timeline) now(kind string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.live[kind])
}

func (t *timeline) peakOf(kind string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.peak[kind]
}

// times returns a copy of one stage's times.
func (t *timeline) times(stage string) map[string]time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]time.Time, len(t.stages[stage]))
	for k, v := range t.stages[stage] {
		out[k] = v
	}
	return out
}

// watch adds event handlers for one kind; observe sees every state and
// returns the object's key ("" to ignore it) and the stages it has reached.
func (t *timeline) watch(ctx context.Context, c cache.Cache, kind string, obj client.Object, observe func(client.Object) (string, []string)) error {
	inf, err := c.GetInformer(ctx, obj)
	if err != nil {
		return err
	}
	seen := func(o any) {
		co, ok := o.(client.Object)
		if !ok {
			return
		}
		key, stages := observe(co)
		if key == "" {
			return
		}
		t.exists(kind, key, true)
		for _, s := range stages {
			t.mark(s, key)
		}
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, o any) { seen(o) },
		DeleteFunc: func(o any) {
			if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if co, ok := o.(client.Object); ok {
				if key, _ := observe(co); key != "" {
					t.exists(kind, key, false)
				}
			}
		},
	})
	return err
}

// watchPool records a pool's launches: pods of app, NodeClaims and Nodes of
// the NodePool in the spoke; the Machines (of the world's namespace) bound
// to those NodeClaims and their AWSMachines on the hub.
func (t *timeline) watchPool(ctx context.Context, hub, spoke cache.Cache, pool, app string) error {
	if err := t.watch(ctx, spoke, "pod", &corev1.Pod{}, func(o client.Object) (string, []string) {
		p := o.(*corev1.Pod)
		if p.Labels["app"] != app {
			return "", nil
		}
		stages := []string{"pod-created"}
		if p.Spec.NodeName != "" {
			stages = append(stages, "pod-bound")
		}
		if podRunning(p) {
			stages = append(stages, "pod-running")
		}
		return p.Name, stages
	}); err != nil {
		return err
	}
	if err := t.watchRunning(ctx, spoke, app); err != nil {
		return err
	}
	if err := t.watch(ctx, spoke, "nodeclaim", &karpv1.NodeClaim{}, func(o client.Object) (string, []string) {
		nc := o.(*karpv1.NodeClaim)
		if nc.Labels[karpv1.NodePoolLabelKey] != pool {
			return "", nil
		}
		t.deleting("nodeclaim", nc.Name, !nc.DeletionTimestamp.IsZero())
		stages := []string{"claim-created"}
		if nc.Status.ProviderID != "" {
			stages = append(stages, "claim-launched")
		}
		if nc.StatusConditions().IsTrue(karpv1.ConditionTypeRegistered) {
			stages = append(stages, "claim-registered")
		}
		if nc.StatusConditions().IsTrue(karpv1.ConditionTypeInitialized) {
			stages = append(stages, "claim-initialized")
		}
		return nc.Name, stages
	}); err != nil {
		return err
	}
	if err := t.watch(ctx, spoke, "node", &corev1.Node{}, func(o client.Object) (string, []string) {
		n := o.(*corev1.Node)
		if n.Labels[karpv1.NodePoolLabelKey] != pool {
			return "", nil
		}
		stages := []string{"node-created"}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				stages = append(stages, "node-ready")
			}
		}
		return n.Name, stages
	}); err != nil {
		return err
	}
	if hub == nil {
		return nil
	}
	return t.watchMachines(ctx, hub, pool)
}

// watchMachines records the pool's Machines (of the world's namespace) and
// their AWSMachines on the hub, and the providerIDs of their instances.
func (t *timeline) watchMachines(ctx context.Context, hub cache.Cache, pool string) error {
	claims := sync.Map{} // infrastructure machine name -> its Machine is the pool's
	if err := t.watch(ctx, hub, "machine", &clusterv1.Machine{}, func(o client.Object) (string, []string) {
		m := o.(*clusterv1.Machine)
		if m.Namespace != w.Namespace || !machineOfPool(m, pool) {
			return "", nil
		}
		claims.Store(m.Spec.InfrastructureRef.Name, true)
		t.deleting("machine", m.Name, !m.DeletionTimestamp.IsZero())
		t.mu.Lock()
		t.zones[m.Name] = m.Spec.FailureDomain
		t.mu.Unlock()
		stages := []string{"machine-created"}
		if m.Spec.ProviderID != "" {
			t.instance(m.Spec.ProviderID)
			stages = append(stages, "machine-providerid")
		}
		return m.Name, stages
	}); err != nil {
		return err
	}
	return t.watch(ctx, hub, "awsmachine", &infrav1.AWSMachine{}, func(o client.Object) (string, []string) {
		am := o.(*infrav1.AWSMachine)
		if _, ok := claims.Load(am.Name); !ok || am.Namespace != w.Namespace {
			return "", nil
		}
		if am.Spec.ProviderID != nil && *am.Spec.ProviderID != "" {
			t.instance(*am.Spec.ProviderID)
			return am.Name, []string{"instance-providerid"}
		}
		return am.Name, nil
	})
}

// watchInstanceNodes records every Node of the spoke by its providerID:
// stages "instance-node-created", "instance-node-ready" and
// "instance-node-gone". A floor's Nodes are those whose providerID is one
// of the pool's instances (poolNodes): a Node may be seen before its
// instance's providerID, so they are told apart when read, not when seen.
func (t *timeline) watchInstanceNodes(ctx context.Context, spoke cache.Cache) error {
	inf, err := spoke.GetInformer(ctx, &corev1.Node{})
	if err != nil {
		return err
	}
	seen := func(o any) {
		n, ok := o.(*corev1.Node)
		if !ok || n.Spec.ProviderID == "" {
			return
		}
		t.mark("instance-node-created", n.Spec.ProviderID)
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				t.mark("instance-node-ready", n.Spec.ProviderID)
			}
		}
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    seen,
		UpdateFunc: func(_, o any) { seen(o) },
		DeleteFunc: func(o any) {
			if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if n, ok := o.(*corev1.Node); ok && n.Spec.ProviderID != "" {
				t.mark("instance-node-gone", n.Spec.ProviderID)
			}
		},
	})
	return err
}

// poolNodes returns one of watchInstanceNodes' stages for the Nodes of the
// pool's instances.
func (t *timeline) poolNodes(stage string) map[string]time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]time.Time{}
	for id, at := range t.stages[stage] {
		if t.ids[id] {
			out[id] = at
		}
	}
	return out
}

// poolNodesNow is how many Nodes of the pool's instances exist now; peak
// the most that existed at once.
func (t *timeline) poolNodesNow() int {
	return len(t.poolNodes("instance-node-created")) - len(t.poolNodes("instance-node-gone"))
}

func (t *timeline) poolNodesPeak() int {
	type event struct {
		at    time.Time
		delta int
	}
	var events []event
	for _, at := range t.poolNodes("instance-node-created") {
		events = append(events, event{at, 1})
	}
	for _, at := range t.poolNodes("instance-node-gone") {
		events = append(events, event{at, -1})
	}
	// A Node gone at the instant another appears counts once.
	sort.Slice(events, func(i, j int) bool {
		if events[i].at.Equal(events[j].at) {
			return events[i].delta < events[j].delta
		}
		return events[i].at.Before(events[j].at)
	})
	cur, peak := 0, 0
	for _, e := range events {
		cur += e.delta
		peak = max(peak, cur)
	}
	return peak
}

// watchRunning keeps the live set "pod-running": app's pods Running, Ready
// and not being deleted now. "N pods Running" is this set's size, not the
// number of pods that were ever Running: a pod whose node went away was
// Running once and its replacement counts again.
func (t *timeline) watchRunning(ctx context.Context, spoke cache.Cache, app string) error {
	inf, err := spoke.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return err
	}
	update := func(o any, gone bool) {
		if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		p, ok := o.(*corev1.Pod)
		if !ok || p.Labels["app"] != app {
			return
		}
		t.exists("pod-running", p.Name, !gone && podRunning(p))
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { update(o, false) },
		UpdateFunc: func(_, o any) { update(o, false) },
		DeleteFunc: func(o any) { update(o, true) },
	})
	return err
}

// machineOfPool: the bench's Machines carry pool=<pool> (Machine mode, from
// the NodeClass metadata) or belong to the MachineDeployment <pool>-md.
func machineOfPool(m *clusterv1.Machine, pool string) bool {
	md := m.Labels[clusterv1.MachineDeploymentNameLabel]
	return m.Labels["pool"] == pool || md == pool+"-md" || strings.HasPrefix(md, pool+"-md-")
}

func podRunning(p *corev1.Pod) bool {
	return p.DeletionTimestamp.IsZero() && podRunningAndReadyE2E(p)
}

func podRunningAndReadyE2E(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// durations are per-object differences between two stages, in seconds,
// for the objects that reached both.
func durations(from, to map[string]time.Time) []float64 {
	var out []float64
	for k, t1 := range to {
		if t0, ok := from[k]; ok {
			out = append(out, t1.Sub(t0).Seconds())
		}
	}
	sort.Float64s(out)
	return out
}

// sinceStart are a stage's times after start, in seconds, sorted.
func sinceStart(start time.Time, m map[string]time.Time) []float64 {
	out := make([]float64, 0, len(m))
	for _, t := range m {
		out = append(out, t.Sub(start).Seconds())
	}
	sort.Float64s(out)
	return out
}

// quantile of sorted values (nearest rank); NaN when empty.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// waves groups sorted times into bursts separated by more than gap seconds:
// "count@start" for each, e.g. NodeClaims created by core's successive
// scheduling rounds.
func waves(sorted []float64, gap float64) string {
	var parts []string
	for i := 0; i < len(sorted); {
		j := i + 1
		for j < len(sorted) && sorted[j]-sorted[j-1] <= gap {
			j++
		}
		parts = append(parts, fmt.Sprintf("%d@%.1fs", j-i, sorted[i]))
		i = j
	}
	return strings.Join(parts, " ")
}

// setMember adds key to (or removes it from) the set of kind in sets.
func setMember(sets map[string]map[string]bool, kind, key string, in bool) {
	m := sets[kind]
	if m == nil {
		m = map[string]bool{}
		sets[kind] = m
	}
	if in {
		m[key] = true
	} else {
		delete(m, key)
	}
}
