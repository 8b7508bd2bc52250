//go:build soak

package soak

import (
	"context"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/e2e"
	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/ha"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// maxPods is the most pods a pool's app asks for (one m5.large each).
const maxPods = 8

// soak is the run's state: the world, the replicas, the pools and what was
// injected and measured.
type soak struct {
	t  *testing.T
	w  *world.World
	rs *ha.ReplicaSet
	// rng draws the schedule (each fault, its pool, length and pod count,
	// the pauses): the same seed gives the same schedule. Choices among
	// what the clusters hold at that moment (which Machine to delete),
	// whose number depends on timing, draw from pick, so that they do not
	// shift the schedule.
	rng  *rand.Rand
	pick *rand.Rand

	pools   []*soakPool
	watch   *ha.HubWatch
	sampler *ha.Sampler
	// foreign is a Machine of a MachineDeployment that is no Karpenter
	// member: nobody but Cluster API may touch it.
	foreign         types.NamespacedName
	foreignUID      types.UID
	foreignGen      int64
	foreignMDName   string
	hubDown         bool
	spokeDown       bool
	unblockedAt     time.Time // launches were last able to resume then
	lastLeader      int       // the replica check last saw leading (-1: none)
	blockedUntilEnd bool      // launches blocked (outage in progress)

	faults     map[string]int
	takeovers  []time.Duration // SIGKILL -> another replica leads
	handovers  []time.Duration // SIGTERM -> another replica leads
	recoveries []string        // outage end -> pods all running
	settles    []time.Duration
	rss        map[*e2e.Provider]*rssSeries
	violations []string
}

type soakPool struct {
	name    string
	mode    ha.Mode
	app     *appsv1.Deployment
	want    int32
	version int // template version (drift)
}

type rssSeries struct {
	started     time.Time
	first, last float64
	firstAt     time.Time
	lastAt      time.Time
}

func newSoak(ctx context.Context, t *testing.T, w *world.World, bin string, rng *rand.Rand) (*soak, error) {
	s := &soak{t: t, w: w, rng: rng, pick: rand.New(rand.NewSource(rng.Int63())), faults: map[string]int{}, rss: map[*e2e.Provider]*rssSeries{}, unblockedAt: time.Now(), lastLeader: -1}
	rs, err := ha.Start(bin, w, ha.Options{Replicas: 2})
	if err != nil {
		return nil, err
	}
	s.rs = rs
	if _, _, err := rs.WaitLeader(ctx, 2*time.Minute, -1); err != nil {
		return nil, err
	}
	for _, p := range []*soakPool{
		{name: "soak-m", mode: ha.MachineMode},
		{name: "soak-md", mode: ha.MachineDeploymentMode},
	} {
		its := map[string]string{"m5.large": "0.096"}
		if p.mode == ha.MachineMode {
			// A dearer type to fall back on while m5.large is exhausted.
			its["m5.xlarge"] = "0.192"
		}
		// OnDelete as docs/concepts.md recommends: RollingUpdate's surge
		// Machines outnumber the NodeClaims during every drift (the first
		// 30-minute soak counted 21 such samples).
		if _, _, err := ha.Pool(ctx, w, p.name, ha.PoolOptions{Mode: p.mode, InstanceTypes: its, OnDelete: true}); err != nil {
			return nil, err
		}
		p.want = 3
		if p.app, err = ha.Deployment(ctx, w, p.name, "app-"+p.name, p.want, "1500m"); err != nil {
			return nil, err
		}
		s.pools = append(s.pools, p)
	}
	if err := s.startForeign(ctx); err != nil {
		return nil, err
	}
	if s.watch, err = ha.WatchHub(ctx, w); err != nil {
		return nil, err
	}
	s.sampler = ha.SampleLiveTolerant(w, 2*time.Second, excessTolerance, s.poolNames()...)
	return s, nil
}

func (s *soak) poolNames() []string {
	var out []string
	for _, p := range s.pools {
		out = append(out, p.name)
	}
	return out
}

// startForeign creates a MachineDeployment that is no Karpenter member
// with one replica, and remembers its Machine once it runs.
func (s *soak) startForeign(ctx context.Context) error {
	s.foreignMDName = "soak-foreign"
	if _, err := s.w.CreateAWSMachineTemplate(ctx, s.foreignMDName, "m5.large", false); err != nil {
		return err
	}
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: s.w.Namespace, Name: s.foreignMDName, ClusterName: s.w.ClusterName, Replicas: 1,
	})
	if err := s.w.Hub.Client.Create(ctx, md); err != nil {
		return err
	}
	return e2e.WaitFor(ctx, 3*time.Minute, func(ctx context.Context) (bool, error) {
		list := &clusterv1.MachineList{}
		if err := s.w.Hub.Client.List(ctx, list, client.InNamespace(s.w.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: s.foreignMDName}); err != nil {
			return false, err
		}
		if len(list.Items) != 1 || list.Items[0].Spec.ProviderID == "" || list.Items[0].Status.NodeRef.Name == "" {
			return false, nil
		}
		m := list.Items[0]
		s.foreign, s.foreignUID, s.foreignGen = client.ObjectKeyFromObject(&m), m.UID, m.Generation
		return true, nil
	})
}

// violate records a broken invariant; the soak goes on so that the report
// shows everything, and fails at the end.
func (s *soak) violate(format string, args ...any) {
	v := time.Now().Format("15:04:05") + " " + fmt.Sprintf(format, args...)
	s.violations = append(s.violations, v)
	s.t.Errorf("seed %d: %s", *seed, v)
}

// check verifies the invariants that hold at every moment.
func (s *soak) check(ctx context.Context) {
	s.sampleRSS()
	s.trackLeader()
	if s.hubDown {
		return
	}
	m := &clusterv1.Machine{}
	if err := s.w.Hub.Client.Get(ctx, s.foreign, m); err != nil {
		if client.IgnoreNotFound(err) == nil {
			s.violate("the foreign Machine %s was deleted", s.foreign)
			s.foreignUID = ""
		}
	} else if s.foreignUID != "" {
		if m.UID != s.foreignUID || !m.DeletionTimestamp.IsZero() || m.Generation != s.foreignGen || m.Annotations[v1alpha1.NodeClaimAnnotation] != "" {
			s.violate("the foreign Machine %s was changed: uid %s (was %s), generation %d (was %d), deleting %v, annotations %v",
				s.foreign, m.UID, s.foreignUID, m.Generation, s.foreignGen, !m.DeletionTimestamp.IsZero(), m.Annotations)
			s.foreignUID = ""
		}
	}
	if s.spokeDown || s.blockedUntilEnd || s.rs.Leader() < 0 {
		return
	}
	for _, p := range s.pools {
		pods := &corev1.PodList{}
		if err := s.w.Spoke.Client.List(ctx, pods, client.MatchingLabels{"app": "app-" + p.name}); err != nil {
			continue
		}
		for _, pod := range pods.Items {
			if pod.Spec.NodeName != "" || !pod.DeletionTimestamp.IsZero() {
				continue
			}
			since := pod.CreationTimestamp.Time
			if s.unblockedAt.After(since) {
				since = s.unblockedAt
			}
			if time.Since(since) > pendingBound {
				s.violate("pod %s pending for %s since launches could resume", pod.Name, time.Since(since).Round(time.Second))
			}
		}
	}
}

// trackLeader tells the excess sampler when the provider can act again:
// while an API server is down or no replica leads it cannot, and a replica
// that begins to lead starts its graces afresh.
func (s *soak) trackLeader() {
	if s.sampler == nil {
		return
	}
	l := s.rs.Leader()
	if l < 0 || l != s.lastLeader || s.hubDown || s.spokeDown {
		s.sampler.Resumed(time.Now())
	}
	s.lastLeader = l
}

// sampleRSS records each replica process's resident memory.
func (s *soak) sampleRSS() {
	leader := s.rs.Leader()
	for i := 0; i < s.rs.Len(); i++ {
		p := s.rs.Provider(i)
		if p.Exited() {
			continue
		}
		r := s.rss[p]
		if r == nil {
			// Measured from the moment the replica leads: a standby
			// runs no controllers and fills its caches only once it
			// leads (a standby of 58 MiB grew to 98 MiB after it took
			// over, as every leader does in its first minutes).
			if i != leader {
				continue
			}
			r = &rssSeries{started: time.Now()}
			s.rss[p] = r
		}
		v, ok, err := p.Metric("process_resident_memory_bytes")
		if err != nil || !ok {
			continue
		}
		if r.first == 0 && time.Since(r.started) >= 2*time.Minute {
			r.first, r.firstAt = v, time.Now()
		}
		r.last, r.lastAt = v, time.Now()
	}
}

// settle stops injecting and waits until every pool's Machines, NodeClaims
// and Nodes match its pods, with no unbound Machine.
func (s *soak) settle(ctx context.Context, why string) {
	start := time.Now()
	var last []string
	err := e2e.WaitFor(ctx, settleBound, func(ctx context.Context) (bool, error) {
		s.check(ctx)
		var seen []string
		// The state of the last complete look is what a failure reports:
		// a look cut short by the deadline shows nothing.
		defer func() {
			if len(seen) == len(s.pools) {
				last = seen
			}
		}()
		ok := true
		for _, p := range s.pools {
			c, err := ha.Count(ctx, s.w, p.name, "app-"+p.name)
			if err != nil {
				return false, err
			}
			seen = append(seen, p.name+": "+c.String())
			nodes := int(p.want)
			if p.mode == ha.MachineMode && s.hasXLarge(ctx, p.name) {
				nodes = -1 // two pods may share an m5.xlarge: only the match matters
			}
			if c.RunningPods != int(p.want) || c.PendingPods != 0 || c.UnboundMachines != 0 ||
				c.NodeClaims != c.Nodes || c.Machines != c.Nodes || (nodes >= 0 && c.Nodes != nodes) {
				ok = false
			}
		}
		return ok, nil
	})
	if err != nil {
		s.violate("not settled %s after %s (%s): %v", why, settleBound, strings.Join(last, "; "), err)
		return
	}
	s.settles = append(s.settles, time.Since(start))
	s.t.Logf("settled (%s) in %s: %s", why, time.Since(start).Round(time.Second), strings.Join(last, "; "))
}

func (s *soak) hasXLarge(ctx context.Context, pool string) bool {
	nodes := &corev1.NodeList{}
	if err := s.w.Spoke.Client.List(ctx, nodes, client.MatchingLabels{"karpenter.sh/nodepool": pool, corev1.LabelInstanceTypeStable: "m5.xlarge"}); err != nil {
		return true
	}
	return len(nodes.Items) > 0
}

// report prints the figures and checks the end-of-run invariants.
func (s *soak) report() {
	samples, violations := s.sampler.Stop()
	for _, v := range violations {
		s.violate("more Machines than NodeClaims: %s", v)
	}
	kinds := make([]string, 0, len(s.faults))
	for k := range s.faults {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var counts []string
	for _, k := range kinds {
		counts = append(counts, fmt.Sprintf("%s=%d", k, s.faults[k]))
	}
	s.t.Logf("SOAK seed=%d faults: %s", *seed, strings.Join(counts, " "))
	s.t.Logf("SOAK takeovers after SIGKILL (kill -> another replica leads): %v (max %s)", round(s.takeovers), maxOf(s.takeovers))
	s.t.Logf("SOAK handovers after SIGTERM: %v (max %s)", round(s.handovers), maxOf(s.handovers))
	s.t.Logf("SOAK recoveries: %s", strings.Join(s.recoveries, "; "))
	s.t.Logf("SOAK settles: %v; Machines<=NodeClaims samples: %d; replica restarts %v", round(s.settles), samples, s.rs.Restarts())
	for p, r := range s.rss {
		if r.first == 0 {
			continue
		}
		lived := r.lastAt.Sub(r.started)
		s.t.Logf("SOAK RSS %s (from when it first led): %.0f MiB at +2m, %.0f MiB at +%s", p.LogPath, r.first/(1<<20), r.last/(1<<20), lived.Round(time.Minute))
		if lived >= 10*time.Minute && r.last > rssGrowth*r.first {
			s.violate("RSS of %s grew from %.0f to %.0f MiB over %s", p.LogPath, r.first/(1<<20), r.last/(1<<20), lived.Round(time.Minute))
		}
	}
	s.t.Logf("SOAK violations: %d", len(s.violations))
}

func round(ds []time.Duration) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Round(100 * time.Millisecond).String()
	}
	return out
}

func maxOf(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m.Round(100 * time.Millisecond)
}
