//go:build soak

package soak

import (
	"context"
	"fmt"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/ha"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// fault is one kind of trouble, with its weight in the schedule.
type fault struct {
	name   string
	weight int
	do     func(s *soak, ctx context.Context)
}

var faults = []fault{
	{"scale-pods", 6, (*soak).scalePods},
	{"kill-replica", 2, (*soak).killLeader},
	{"terminate-replica", 1, (*soak).terminateReplica},
	{"hub-outage", 1, (*soak).hubOutage},
	{"spoke-outage", 1, (*soak).spokeOutage},
	{"insufficient-capacity", 1, (*soak).insufficientCapacity},
	{"delete-machine", 2, (*soak).deleteMachine},
	{"drift", 1, (*soak).drift},
}

// run injects faults until d has passed, with a settle check about every
// 8 minutes and at the end.
func (s *soak) run(ctx context.Context, d time.Duration) {
	total := 0
	for _, f := range faults {
		total += f.weight
	}
	end := time.Now().Add(d)
	nextSettle := time.Now().Add(8 * time.Minute)
	for time.Now().Before(end) {
		s.idle(ctx, time.Duration(10+s.rng.Intn(30))*time.Second)
		if time.Now().After(nextSettle) {
			s.settle(ctx, "mid-run")
			nextSettle = time.Now().Add(8 * time.Minute)
			continue
		}
		pick := s.rng.Intn(total)
		for _, f := range faults {
			if pick -= f.weight; pick < 0 {
				s.faults[f.name]++
				s.t.Logf("fault %d: %s", sum(s.faults), f.name)
				f.do(s, ctx)
				break
			}
		}
	}
	s.t.Logf("faults stopped after %s; settling", d)
	s.settle(ctx, "at the end")
	s.idle(ctx, 30*time.Second) // settled means staying settled
	s.settle(ctx, "30 s after the end")
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// idle waits d, checking the invariants every 5 s.
func (s *soak) idle(ctx context.Context, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		s.check(ctx)
		time.Sleep(min(5*time.Second, time.Until(deadline)))
	}
}

func (s *soak) pool() *soakPool { return s.pools[s.rng.Intn(len(s.pools))] }

func (s *soak) scalePods(ctx context.Context) {
	p := s.pool()
	p.want = int32(s.rng.Intn(maxPods + 1))
	if err := ha.Scale(ctx, s.w, p.app, p.want); err != nil {
		s.t.Logf("scaling %s: %v", p.name, err)
		return
	}
	s.t.Logf("  %s: %d pods", p.name, p.want)
}

// The soak kills and stops only replica-0 on purpose; replica-1 exits only
// when it loses the Lease (a workload-cluster outage while it leads). So a
// replica-1 process usually lives long enough to tell whether memory stays
// flat.
const victim = 0

// killLeader kills replica-0 with SIGKILL (a lost node, an OOM kill) and,
// when it led, measures how soon the other replica leads.
func (s *soak) killLeader(ctx context.Context) {
	wasLeader := s.rs.Leader() == victim
	if s.rs.Provider(victim).Exited() {
		s.t.Logf("  replica-%d is not running", victim)
		return
	}
	killed := s.rs.Provider(victim)
	at := time.Now()
	s.rs.Kill(victim)
	if !wasLeader {
		s.t.Logf("  standby replica-%d killed", victim)
		return
	}
	s.blockedUntilEnd = true
	defer func() { s.blockedUntilEnd, s.unblockedAt = false, time.Now() }()
	next, _, err := s.rs.WaitLeader(ctx, 2*time.Minute, -1)
	if err != nil || s.rs.Provider(next) == killed {
		s.violate("no other replica leads within 2 minutes of killing the leader replica-%d", victim)
		return
	}
	s.takeovers = append(s.takeovers, time.Since(at))
	s.t.Logf("  leader replica-%d killed; replica-%d leads after %s", victim, next, time.Since(at).Round(100*time.Millisecond))
}

// terminateReplica stops replica-0 gracefully (a rolling update, a drain).
func (s *soak) terminateReplica(ctx context.Context) {
	if s.rs.Provider(victim).Exited() {
		s.t.Logf("  replica-%d is not running", victim)
		return
	}
	wasLeader := s.rs.Leader() == victim
	at := time.Now()
	s.rs.Terminate(victim)
	if !wasLeader {
		s.t.Logf("  standby replica-%d terminated", victim)
		return
	}
	next, _, err := s.rs.WaitLeader(ctx, time.Minute, -1)
	if err != nil {
		s.violate("no replica leads within a minute of terminating the leader replica-%d", victim)
		return
	}
	s.handovers = append(s.handovers, time.Since(at))
	s.t.Logf("  leader replica-%d terminated; replica-%d leads after %s", victim, next, time.Since(at).Round(100*time.Millisecond))
}

func (s *soak) outageLength() time.Duration { return time.Duration(10+s.rng.Intn(80)) * time.Second }

func (s *soak) hubOutage(ctx context.Context) {
	d := s.outageLength()
	if err := s.w.StopHubAPIServer(); err != nil {
		s.t.Logf("  stopping the hub API server: %v", err)
		return
	}
	s.hubDown, s.blockedUntilEnd = true, true
	s.t.Logf("  hub API server down for %s", d)
	s.idle(ctx, d)
	if err := s.w.StartHubAPIServer(ctx); err != nil {
		s.t.Fatalf("seed %d: restarting the hub API server: %v", *seed, err)
	}
	s.hubDown, s.blockedUntilEnd, s.unblockedAt = false, false, time.Now()
	s.sampler.Resumed(s.unblockedAt)
	s.recoveries = append(s.recoveries, s.recovery(ctx, fmt.Sprintf("hub %s", d)))
	s.t.Logf("  %s", s.recoveries[len(s.recoveries)-1])
}

func (s *soak) spokeOutage(ctx context.Context) {
	d := s.outageLength()
	if err := s.w.StopSpokeAPIServer(); err != nil {
		s.t.Logf("  stopping the spoke API server: %v", err)
		return
	}
	s.spokeDown, s.blockedUntilEnd = true, true
	s.t.Logf("  spoke API server down for %s", d)
	s.idle(ctx, d)
	if err := s.w.StartSpokeAPIServer(ctx); err != nil {
		s.t.Fatalf("seed %d: restarting the spoke API server: %v", *seed, err)
	}
	s.spokeDown, s.blockedUntilEnd, s.unblockedAt = false, false, time.Now()
	s.sampler.Resumed(s.unblockedAt)
	s.recoveries = append(s.recoveries, s.recovery(ctx, fmt.Sprintf("spoke %s", d)))
	s.t.Logf("  %s", s.recoveries[len(s.recoveries)-1])
}

// recovery reports how soon after an outage every pod runs again (or that
// it did not within 2 minutes: the pending bound judges that).
func (s *soak) recovery(ctx context.Context, what string) string {
	start := time.Now()
	for time.Since(start) < 2*time.Minute {
		pending := 0
		for _, p := range s.pools {
			c, err := ha.CountSpoke(ctx, s.w, p.name, "app-"+p.name)
			if err != nil {
				pending = -1
				break
			}
			pending += c.PendingPods
		}
		if pending == 0 {
			return fmt.Sprintf("%s: pods all running %s after", what, time.Since(start).Round(100*time.Millisecond))
		}
		s.check(ctx)
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Sprintf("%s: pods still pending 2m after", what)
}

// insufficientCapacity exhausts m5.large in every zone for a while:
// Machine mode falls back to m5.xlarge; MachineDeployment mode (m5.large
// only) waits for capacity, as Cluster API retries the instance.
func (s *soak) insufficientCapacity(ctx context.Context) {
	d := time.Duration(30+s.rng.Intn(60)) * time.Second
	s.w.AWS.SetInsufficientCapacity("m5.large", "", "", true)
	s.t.Logf("  m5.large exhausted for %s", d)
	time.AfterFunc(d, func() { s.w.AWS.SetInsufficientCapacity("m5.large", "", "", false) })
}

// deleteMachine deletes a bound Karpenter Machine, as someone else (a
// person, a MachineHealthCheck) would.
func (s *soak) deleteMachine(ctx context.Context) {
	p := s.pool()
	list := &clusterv1.MachineList{}
	if err := s.w.Hub.Client.List(ctx, list, client.InNamespace(s.w.Namespace), client.MatchingLabels{"pool": p.name}); err != nil {
		return
	}
	var bound []clusterv1.Machine
	for _, m := range list.Items {
		if m.Annotations[v1alpha1.NodeClaimAnnotation] != "" && m.DeletionTimestamp.IsZero() {
			bound = append(bound, m)
		}
	}
	if len(bound) == 0 {
		s.t.Logf("  %s: no Machine to delete", p.name)
		return
	}
	m := bound[s.pick.Intn(len(bound))] // not s.rng: how many there are depends on timing
	if err := s.w.Hub.Client.Delete(ctx, &m); err != nil {
		s.t.Logf("  deleting Machine %s: %v", m.Name, err)
		return
	}
	s.t.Logf("  %s: Machine %s deleted by someone else", p.name, m.Name)
}

// drift makes a pool's nodes drift: Machine mode, a new member template of
// the same type replaces the old one (which loses the member label);
// MachineDeployment mode, the MachineDeployment moves to a new template.
func (s *soak) drift(ctx context.Context) {
	p := s.pool()
	p.version++
	base := p.name + "-m5-large"
	oldName := base
	if p.version > 1 {
		oldName = fmt.Sprintf("%s-v%d", base, p.version-1)
	}
	newName := fmt.Sprintf("%s-v%d", base, p.version)
	tmpl := world.AWSMachineTemplate(s.w.Namespace, newName, "m5.large", false)
	tmpl.Annotations = map[string]string{v1alpha1.PriceAnnotation: "0.096"}
	if p.mode == ha.MachineMode {
		tmpl.Labels = map[string]string{v1alpha1.KarpenterMemberLabel: "", "pool": p.name, clusterv1.ClusterNameLabel: s.w.ClusterName}
	}
	status := tmpl.Status
	if err := s.w.Hub.Client.Create(ctx, tmpl); err != nil {
		s.t.Logf("  creating template %s: %v", newName, err)
		return
	}
	tmpl.Status = status
	if err := s.w.Hub.Client.Status().Update(ctx, tmpl); err != nil {
		s.t.Logf("  template %s status: %v", newName, err)
	}
	if p.mode == ha.MachineMode {
		old := world.AWSMachineTemplate(s.w.Namespace, oldName, "m5.large", false)
		if err := s.w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(old), old); err != nil {
			s.t.Logf("  reading template %s: %v", oldName, err)
			return
		}
		patch := client.MergeFrom(old.DeepCopy())
		delete(old.Labels, v1alpha1.KarpenterMemberLabel)
		if err := s.w.Hub.Client.Patch(ctx, old, patch); err != nil {
			s.t.Logf("  retiring template %s: %v", oldName, err)
		}
	} else {
		md := &clusterv1.MachineDeployment{}
		if err := s.w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: s.w.Namespace, Name: base}, md); err != nil {
			s.t.Logf("  reading MachineDeployment %s: %v", base, err)
			return
		}
		patch := client.MergeFrom(md.DeepCopy())
		md.Spec.Template.Spec.InfrastructureRef.Name = newName
		if err := s.w.Hub.Client.Patch(ctx, md, patch); err != nil {
			s.t.Logf("  moving MachineDeployment %s: %v", base, err)
		}
	}
	s.t.Logf("  %s drifts to template %s", p.name, newName)
}
