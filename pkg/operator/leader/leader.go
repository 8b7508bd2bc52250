// Package leader runs the leader election of the provider's replicas.
//
// Why not Karpenter core's: core builds its controller manager with
// controller-runtime's lease timings (15 s lease, 10 s renew deadline, 2 s
// retry) and offers no way to change them, so a crashed leader is replaced
// only 14-20 s later. This package elects with timings the user sets
// (LEADER_ELECTION_LEASE_DURATION, ...), on the same Lease core would use
// (LEADER_ELECTION_NAME in LEADER_ELECTION_NAMESPACE or the Pod's
// namespace), and core's own election is turned off (see options.Parse).
//
// How: Gate wraps core's manager. Every runnable that would have waited for
// core's election (controllers, singletons: anything that needs leader
// election) is started by the manager at once but blocks until this replica
// leads; caches (the workload cluster's and the management cluster's),
// metrics and health probes run on every replica, so a standby's informers
// are warm when it takes over. On a graceful stop the Lease is released
// only after every leader-only runnable has returned, so the next leader
// never acts beside this one; a replica that fails to renew its Lease exits
// at once, because another may already lead.
package leader

import (
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	crleaderelection "sigs.k8s.io/controller-runtime/pkg/leaderelection"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// Defaults of the lease timings. A crashed leader is replaced after at most
// LeaseDuration + 2 × 2.2 × RetryPeriod: a standby sees the last renewal
// at its next attempt, waits the lease out, and takes it at its next
// attempt; client-go waits RetryPeriod plus up to 1.2 × RetryPeriod of
// jitter between attempts. With these: 10.2 s. The leader writes the Lease
// every RetryPeriod (2 writes/s); each standby reads it as often. A leader
// that cannot renew for RenewDeadline (an API server that does not answer
// for longer) exits.
const (
	DefaultLeaseDuration = 8 * time.Second
	DefaultRenewDeadline = 6 * time.Second
	DefaultRetryPeriod   = 500 * time.Millisecond
)

// defaultSlowStop is how long leader-only runnables may take to return on a
// graceful stop before the replica logs which still run (and, after twice
// that, every goroutine's stack): well within Kubernetes' default 30 s
// termination grace period.
const defaultSlowStop = 5 * time.Second

// Settings of the election.
type Settings struct {
	// Enabled is false when the user disabled leader election (core's
	// DISABLE_LEADER_ELECTION): every runnable starts at once.
	Enabled bool
	// Name and Namespace of the Lease; Namespace defaults to the Pod's.
	Name, Namespace                           string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// Validate checks the timings as client-go does, with the flag names.
func (s Settings) Validate() error {
	if !s.Enabled {
		return nil
	}
	switch {
	case s.RetryPeriod <= 0:
		return fmt.Errorf("leader election retry period (LEADER_ELECTION_RETRY_PERIOD) must be positive, got %s", s.RetryPeriod)
	case s.RenewDeadline <= time.Duration(leaderelection.JitterFactor*float64(s.RetryPeriod)):
		return fmt.Errorf("leader election renew deadline (LEADER_ELECTION_RENEW_DEADLINE) %s must be longer than %.1f × the retry period %s",
			s.RenewDeadline, leaderelection.JitterFactor, s.RetryPeriod)
	case s.LeaseDuration <= s.RenewDeadline:
		// A leader must give up before a standby may take over.
		return fmt.Errorf("leader election lease duration (LEADER_ELECTION_LEASE_DURATION) %s must be longer than the renew deadline %s",
			s.LeaseDuration, s.RenewDeadline)
	case s.LeaseDuration < time.Second:
		// The Lease records whole seconds.
		return fmt.Errorf("leader election lease duration (LEADER_ELECTION_LEASE_DURATION) %s must be at least 1s", s.LeaseDuration)
	}
	return nil
}

// Gate is a manager whose leader-only runnables wait for this replica to
// lead. Build it with Wrap before anything is added to the manager.
type Gate struct {
	manager.Manager
	settings Settings
	elected  chan struct{}
	// running holds the leader-only runnables that started; once stopping,
	// idle is closed when none runs any more, and the Lease is released.
	mu       sync.Mutex
	running  map[*gated]struct{}
	stopping bool
	idle     chan struct{}
	idleOnce sync.Once
	// slowStop is how long a stop may take before it is reported.
	slowStop time.Duration
	// exit ends the process when the Lease is lost, restart replaces it
	// after an outage (tests replace both).
	exit    func(code int)
	restart func() error
	log     logr.Logger
}

// afterOutage restarts a standby whose workload cluster was unreachable for
// longer than the renew deadline (see outage.go). A leader cannot get here:
// it exits once it cannot renew for the renew deadline.
func (g *Gate) afterOutage(down time.Duration) {
	select {
	case <-g.elected:
		return
	default:
	}
	g.log.Info("workload cluster reachable again after an outage: restarting this standby so that its caches list afresh", "outage", down.Round(time.Second).String())
	if err := g.restart(); err != nil {
		g.log.Error(err, "restarting after the outage failed; exiting")
		g.exit(1)
	}
}

// Wrap returns mgr with the election of s, adding the elector to mgr. With
// election disabled, mgr is returned as it is.
func Wrap(mgr manager.Manager, s Settings) (manager.Manager, error) {
	if !s.Enabled {
		return mgr, nil
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	g := &Gate{Manager: mgr, settings: s, elected: make(chan struct{}), idle: make(chan struct{}), exit: os.Exit, restart: reexec, slowStop: defaultSlowStop,
		log: mgr.GetLogger().WithName("leader-election").WithValues("lease", s.Namespace+"/"+s.Name)}
	lock, err := newLock(mgr.GetConfig(), mgr, s)
	if err != nil {
		return nil, fmt.Errorf("leader election: %w", err)
	}
	watch := &outageWatch{Interface: lock, threshold: s.RenewDeadline, now: time.Now, back: g.afterOutage}
	e, err := g.newElector(watch)
	if err != nil {
		return nil, fmt.Errorf("leader election: %w", err)
	}
	// A replica that stopped renewing should be restarted even if it
	// somehow failed to exit.
	if err := mgr.AddHealthzCheck("leader-election", func(_ *http.Request) error { return e.Check(2 * time.Second) }); err != nil {
		return nil, err
	}
	if err := mgr.Add(&electorRunnable{gate: g, elector: e}); err != nil {
		return nil, err
	}
	return g, nil
}

func newLock(cfg *rest.Config, rp recorder.Provider, s Settings) (resourcelock.Interface, error) {
	return crleaderelection.NewResourceLock(rest.CopyConfig(cfg), rp, crleaderelection.Options{
		LeaderElection:             true,
		LeaderElectionResourceLock: resourcelock.LeasesResourceLock,
		LeaderElectionID:           s.Name,
		LeaderElectionNamespace:    s.Namespace,
		RenewDeadline:              s.RenewDeadline,
	})
}

// Elected is closed once this replica leads.
func (g *Gate) Elected() <-chan struct{} { return g.elected }

// Add adds r to the manager; a runnable that needs leader election (by
// controller-runtime's rules) waits for this replica to lead.
func (g *Gate) Add(r manager.Runnable) error {
	if !needsLeader(r) {
		return g.Manager.Add(r)
	}
	return g.Manager.Add(&gated{Runnable: r, gate: g})
}

// needsLeader mirrors how controller-runtime's manager groups runnables:
// those it would start only on the leader.
func needsLeader(r manager.Runnable) bool {
	switch v := r.(type) {
	case *manager.Server:
		return v.NeedLeaderElection()
	case hasCache:
		return false
	case webhook.Server:
		return false
	case manager.LeaderElectionRunnable:
		return v.NeedLeaderElection()
	}
	return true
}

type hasCache interface{ GetCache() cache.Cache }
