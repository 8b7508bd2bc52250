package machinedeployment

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/failpoint"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
)

// Timing of the controller's pass.
const (
	// OrphanGrace is how long a reservation or a bound Machine may exist
	// without its NodeClaim (or a reservation without a Machine the
	// MachineSet could still make) before it is given back, released or
	// handed over.
	OrphanGrace = 30 * time.Second
	// keptGrace is how long a marked Machine the MachineSet keeps is left
	// before the provider deletes it itself.
	keptGrace = 10 * time.Second
	// bindAttempts is how many times one pass patches a Machine it binds
	// when the Machine changed since the read in what the binding decides
	// on (each after a live read).
	bindAttempts = 3
	// barrierRetry is how soon a pass looks again when a Machine changed
	// under its write.
	barrierRetry = 200 * time.Millisecond
	// openRecheck is how often a MachineDeployment with open reservations
	// is looked at again without an event.
	openRecheck = 5 * time.Second
	// TakeUpDelay is how long reservations that Machines took up wait to be
	// dropped from the records when no other write of the
	// MachineDeployment comes first and no reservation of it still waits
	// for its Machine: a burst's bindings go in one write instead of one
	// each (every write of the records is copied by Cluster API onto the
	// MachineSet, and each change of either makes Cluster API reconcile
	// every Machine of the MachineDeployment). Until then each is done at
	// every decision: plan drops a reservation a Machine took up.
	TakeUpDelay = 5 * time.Second
	// TakeUpMaxDelay is how long they wait while reservations of the
	// MachineDeployment still wait for their Machines (a burst still
	// binding): its bindings go in one write when it ends, or one per
	// TakeUpMaxDelay while it lasts.
	TakeUpMaxDelay = time.Minute
	// passBudget bounds how long one pass goes on starting writes to
	// Machines (binds, marks) while it holds the MachineDeployment's lock;
	// the rest waits for the next pass, passBudgetRequeue later. Launch's
	// reservations queue behind that lock: at 1 000 Machines a pass that
	// bound or marked hundreds of Machines in one go held every raise of a
	// burst for tens of seconds (bench-1000, issue 36). A pass stopped here
	// is a prefix of a whole pass, which is a state the protocol already
	// meets after a crash.
	passBudget        = time.Second
	passBudgetRequeue = 10 * time.Millisecond
	// BindRound is how many bindings a pass makes at once (bindOpen): a
	// hub under load answers each in one to two seconds, and one at a time
	// a pass bound one Machine per budget (N = 500 and 1 000, separated).
	BindRound = 16
)

// claimState is what the spoke says of a NodeClaim.
type claimState int

const (
	claimPending     claimState = iota // exists, not launched, not terminating
	claimLaunched                      // has a providerID
	claimTerminating                   // deletionTimestamp set
	claimGone                          // a live read says NotFound
	claimUnknown                       // an error: nothing is decided on it
)

// claimState reads a NodeClaim from the spoke cache; NotFound is confirmed
// by a live read (an error is never taken as gone).
func (c *Controller) claimState(ctx context.Context, name string, live bool) claimState {
	if isMoved(name) {
		return claimGone // a launch moved on: no NodeClaim has the key
	}
	nc := &karpv1.NodeClaim{}
	var err error
	if live {
		if c.provider.gone.confirmed(name) {
			return claimGone
		}
		err = c.provider.gone.readLive(ctx, c.spokeAPI, name, nc)
	} else {
		// Read, never changed: the cache's own copy.
		err = c.spoke.Get(ctx, types.NamespacedName{Name: name}, nc, client.UnsafeDisableDeepCopy)
	}
	if apierrors.IsNotFound(err) && !live {
		return c.claimState(ctx, name, true)
	}
	switch {
	case apierrors.IsNotFound(err):
		return claimGone
	case err != nil:
		return claimUnknown
	case !nc.DeletionTimestamp.IsZero():
		return claimTerminating
	case nc.Status.ProviderID != "":
		return claimLaunched
	}
	return claimPending
}

// firstSeen remembers when a condition was first seen, for the graces: an
// observation, not a record (a restart starts the grace again).
type firstSeen struct {
	mu   sync.Mutex
	seen map[string]time.Time
}

func (f *firstSeen) since(key string, now time.Time) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen == nil {
		f.seen = map[string]time.Time{}
	}
	if t, ok := f.seen[key]; ok {
		return t
	}
	f.seen[key] = now
	return now
}

// keep forgets the keys under prefix not in touched.
func (f *firstSeen) keep(prefix string, touched map[string]bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k := range f.seen {
		if strings.HasPrefix(k, prefix) && !touched[k] {
			delete(f.seen, k)
		}
	}
}

// pass is the controller's level-triggered pass over one MachineDeployment
// (docs/design/machinedeployment-binding.md, "Rules"): bind, reclaim,
// release orphans, give back free reservations, hand over stranded ones,
// lower what marks cover, delete kept Machines, report useless ones. It
// holds the MachineDeployment's lock and decides only on a cache that shows
// this process's writes. It returns when to look again.
func (c *Controller) pass(ctx context.Context, md *clusterv1.MachineDeployment, member bool) (time.Duration, error) {
	key := client.ObjectKeyFromObject(md)
	unlock := c.provider.locks.lock(key)
	defer unlock()
	s, retry, err := c.readPass(ctx, md)
	if s == nil || err != nil {
		return retry, err
	}
	defer func() { c.seen.keep(s.prefix, s.touched) }()
	steps := []func(context.Context) error{
		s.bindOpen,           // 1
		s.machineIntents,     // 2, 3, 6, 7
		s.reservationIntents, // 4, 5
		s.spareIntent,
		s.writeRecords,
	}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return 0, err
		}
	}
	// 8. Machines of a member MachineDeployment no NodeClaim owns.
	if member {
		s.later(c.reportUnowned(s.md, s.machines, s.open, settled(s.cnt, s.r), s.now))
	}
	return s.requeue, nil
}

// passState is one pass's view of a MachineDeployment (read once, behind
// the barrier) and what its steps decided so far.
type passState struct {
	c      *Controller
	p      *Provider
	key    types.NamespacedName
	md     *clusterv1.MachineDeployment
	recs   records // as read
	norm   outcome // normalized, no intents
	cnt    counts
	low    lowering // which MachineSet a lowering comes off now
	r      int32
	now    time.Time
	prefix string

	machines   []*clusterv1.Machine
	candidates []*clusterv1.Machine
	// open: the reservations with their stamps, oldest first.
	open []reservation
	// taken: Machines bound, marked or changed in this pass.
	taken   map[string]bool
	intents []*intent
	spare   int32
	// liveMachines: the Machines read live in this pass (nil: not yet).
	liveMachines []*clusterv1.Machine

	bindable func(*clusterv1.Machine) bool
	touched  map[string]bool
	requeue  time.Duration
	// writesFrom: when the pass's first write to a Machine began.
	writesFrom time.Time
	// bound: how many reservations the pass bound.
	bound int
	// bindSkip: NodeClaims step 1 found bound already or could not tell.
	bindSkip map[string]bool
}

// readPass reads what a pass decides on: the MachineDeployment (live on
// this process's first pass over it), its records, Machines and
// MachineSets, each as this process last wrote it when the cache does not
// show that write yet (the barrier). A nil state ends the pass (records
// that cannot be read are reported through the instance-type store).
func (c *Controller) readPass(ctx context.Context, md *clusterv1.MachineDeployment) (*passState, time.Duration, error) {
	p := c.provider
	key := client.ObjectKeyFromObject(md)
	md = latest(&p.barrier, "MachineDeployment", key, md)
	// A process's first pass over a MachineDeployment reads it and its
	// Machines live: its cache may not show yet what the process before it
	// (a leader handover) wrote last, which no barrier of this one covers.
	reader := client.Reader(p.hub.GetCache())
	if _, seen := c.readLive.Load(key); !seen {
		reader = p.hub.GetAPIReader()
		live := &clusterv1.MachineDeployment{}
		if err := reader.Get(ctx, key, live); err != nil {
			return nil, 0, client.IgnoreNotFound(err)
		}
		md = live
	}
	recs, err := readRecords(md)
	if err != nil {
		// Reported through the instance-type store (the Source's error:
		// left out of offerings, a NodeClass problem and event).
		return nil, 0, nil
	}
	machines, err := machinesOf(ctx, reader, md)
	if err != nil {
		return nil, 0, err
	}
	c.readLive.Store(key, true)
	for i, m := range machines {
		machines[i] = latest(&p.barrier, "Machine", client.ObjectKeyFromObject(m), m)
	}
	sets, err := setsOf(ctx, reader, md)
	if err != nil {
		return nil, 0, err
	}
	s := &passState{c: c, p: p, key: key, md: md, recs: recs, machines: machines, now: p.now(),
		r: ptr.Deref(md.Spec.Replicas, 0), prefix: key.String() + "/", taken: map[string]bool{}, touched: map[string]bool{}, bindSkip: map[string]bool{}}
	free := func(claim string) bool { return p.claimFree(ctx, claim) }
	s.bindable = func(m *clusterv1.Machine) bool { return noRegisteredNode(ctx, c.spoke, m) }
	s.norm = plan(md, recs, view{machines: machines, sets: sets, free: free, bindable: s.bindable}, nil)
	s.cnt = count(machines, nil)
	// Which MachineSet a lowering would come off now: a free reservation
	// is given back only with a Machine of that one (marking another would
	// be undone by the refused write, pass after pass).
	s.low = lowers(md, sets, machines)
	for claim, raised := range s.norm.recs.pending {
		at, ok := stampOf(md, raised)
		if !ok {
			log.FromContext(ctx).Error(fmt.Errorf("MachineDeployment %s: reservation of NodeClaim %s has no stamp and the MachineDeployment no managed-fields entry of %s", key, claim, FieldManager),
				"reservation left unbound")
			continue
		}
		s.open = append(s.open, reservation{claim: claim, at: at, state: c.claimState(ctx, claim, false)})
	}
	sort.Slice(s.open, func(i, j int) bool {
		if !s.open[i].at.Equal(s.open[j].at) {
			return s.open[i].at.Before(s.open[j].at)
		}
		return s.open[i].claim < s.open[j].claim
	})
	s.candidates = c.candidates(ctx, machines)
	s.spare = s.norm.recs.owned - s.cnt.bound - int32(len(s.norm.recs.pending))
	return s, 0, nil
}

// since returns how long the condition what has been seen (a grace's
// clock), and keeps it remembered past this pass.
func (s *passState) since(what string) time.Duration {
	k := s.prefix + what
	s.touched[k] = true
	return s.now.Sub(s.c.seen.since(k, s.now))
}

// later asks for the pass to be run again within d.
func (s *passState) later(d time.Duration) {
	if d > 0 && (s.requeue == 0 || d < s.requeue) {
		s.requeue = d
	}
}

// overBudget reports (and requeues for) a pass that has spent passBudget
// on writes to Machines: no more of them in this pass. The budget starts at
// the pass's first such write, which it always makes: reads before it (many
// of them live when NodeClaims are gone) never keep a pass from
// progressing.
func (s *passState) overBudget() bool {
	if s.writesFrom.IsZero() {
		s.writesFrom = s.p.now()
		return false
	}
	if s.p.now().Sub(s.writesFrom) < passBudget {
		return false
	}
	s.later(passBudgetRequeue)
	return true
}

// bindOpen is step 1: each open reservation of a pending NodeClaim, oldest
// first, is bound to the oldest Machine made for it. The pairs of a round
// are bound at once (BindRound at a time); a reservation whose Machine could not be
// bound is paired with the next Machine in the next round, as long as the
// pass is within its budget.
func (s *passState) bindOpen(ctx context.Context) error {
	for !s.overBudget() {
		pairs := s.pairOpen(ctx)
		if len(pairs) == 0 {
			break
		}
		results, err := s.c.bindAll(ctx, pairs)
		for i, pr := range pairs {
			switch results[i] {
			case bound:
				s.bound++
				pr.e.state = claimLaunched // not open any more in this pass
				s.taken[pr.m.Name] = true
			case machineRefused:
				s.taken[pr.m.Name] = true // changed: not a candidate again in this pass
			case claimDone:
				s.bindSkip[pr.e.claim] = true // the Machine stays a candidate
			}
		}
		if err != nil {
			return err
		}
	}
	for i := range s.open {
		if s.open[i].state == claimPending {
			s.later(openRecheck)
		}
	}
	return nil
}

// bindPair is a reservation and the Machine a round binds it to.
type bindPair struct {
	e *reservation
	m *clusterv1.Machine
}

// pairOpen pairs the open reservations of pending NodeClaims, oldest first,
// each with the oldest candidate made for it that no pair took yet, up to
// BindRound pairs. A NodeClaim bound already (by another pass or process)
// is not paired.
func (s *passState) pairOpen(ctx context.Context) []bindPair {
	var pairs []bindPair
	inRound := map[string]bool{}
	for i := range s.open {
		if len(pairs) == BindRound {
			break
		}
		e := &s.open[i]
		if e.state != claimPending || s.bindSkip[e.claim] {
			continue
		}
		if other, err := s.p.BoundMachine(ctx, e.claim); err != nil || other != nil {
			s.bindSkip[e.claim] = true
			continue
		}
		for _, m := range s.candidates {
			if s.taken[m.Name] || inRound[m.Name] || !madeFor(m, e.at) {
				continue
			}
			inRound[m.Name] = true
			pairs = append(pairs, bindPair{e: e, m: m})
			break
		}
	}
	return pairs
}

// bindResult is what became of one pair of a round.
type bindResult int

const (
	// machineRefused: the Machine changed so that it cannot be bound (or is
	// gone); the reservation is paired with the next Machine.
	machineRefused bindResult = iota
	// claimDone: the NodeClaim is gone, terminating or launched; its
	// Machine is left for the next reservation.
	claimDone
	bound
)

// bindAll binds the pairs at once, each its own write: a hub under load
// answers a patch in one to two seconds. err is the first error.
func (c *Controller) bindAll(ctx context.Context, pairs []bindPair) ([]bindResult, error) {
	results := make([]bindResult, len(pairs))
	errs := make([]error, len(pairs))
	var wg sync.WaitGroup
	for i, pr := range pairs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = c.bind(ctx, pr.m, pr.e.claim, pr.e.at)
		}()
	}
	wg.Wait()
	return results, errors.Join(errs...)
}

// machineIntents are steps 2, 3, 6 and 7, decided per Machine: reclaim the
// replica of a bound Machine someone else deletes, release orphans, lower
// what marks still owe, delete released and given-back Machines the
// MachineSet keeps.
func (s *passState) machineIntents(ctx context.Context) error {
	p := s.p
	for _, m := range s.machines {
		claim := m.Annotations[v1alpha1.NodeClaimAnnotation]
		switch {
		case !m.DeletionTimestamp.IsZero():
			// 2. Reclaim: a bound Machine someone else deletes leaves its
			// replica to its NodeClaim (the writer checks it is spare).
			// So does a released one deleted before its replica was
			// lowered (a rollout removing it while its surge kept the
			// lowering refused): still spare, the replica would otherwise
			// pass to no one. Only while its NodeClaim is leaving: a
			// NodeClaim whose launch failed here launches elsewhere.
			// The writer counts as its replica only a spare beyond the
			// lowerings live released Machines still owe.
			if claim != "" && s.spare > 0 && (!markedByUs(m) || p.claimLeaving(ctx, claim)) {
				s.intents = append(s.intents, &intent{kind: intentReclaim, claim: claim, at: m.CreationTimestamp.Time, released: markedByUs(m)})
			}
		case markedByUs(m) && claim != "":
			// 6. Marked, replica maybe still owed (a crash between mark
			// and lower): the writer lowers only what is owed.
			if s.spare > 0 {
				s.intents = append(s.intents, &intent{kind: intentLower, claim: claim, machine: m, why: "released"})
			} else if settled(s.cnt, s.r) && s.since("kept/"+m.Name) >= keptGrace {
				// 7. Kept: the MachineSet has as many Machines as
				// replicas and keeps this one; no replica is owed.
				log.FromContext(ctx).Info("deleting a released Machine its MachineSet kept", "Machine", client.ObjectKeyFromObject(m), "NodeClaim", claim)
				if err := p.deleteMachine(ctx, m); err != nil && !errors.Is(err, ErrMachineGone) {
					return err
				}
				metrics.OrphansReleased.WithLabelValues("kept").Inc()
			} else {
				s.later(keptGrace)
			}
		case markedByUs(m):
			if err := s.givenBack(ctx, m); err != nil {
				return err
			}
		case claim != "" && !s.taken[m.Name]:
			// 3. Orphans: bound, its NodeClaim gone.
			if s.c.claimState(ctx, claim, false) != claimGone {
				continue
			}
			if wait := OrphanGrace - s.since("orphan/"+m.Name); wait > 0 {
				s.later(wait)
				continue
			}
			if s.overBudget() {
				continue
			}
			log.FromContext(ctx).Info("releasing a Machine whose NodeClaim is gone", "Machine", client.ObjectKeyFromObject(m), "NodeClaim", claim)
			if _, err := p.mark(ctx, m, releaseMark(claim, "is gone")); err != nil && !errors.Is(err, ErrMachineGone) {
				return err
			}
			s.intents = append(s.intents, &intent{kind: intentLower, claim: claim, machine: m, why: "is gone"})
			metrics.OrphansReleased.WithLabelValues("machine").Inc()
		}
	}
	return nil
}

// givenBack decides on an unbound Machine the provider marked to give a
// reservation back with.
func (s *passState) givenBack(ctx context.Context, m *clusterv1.Machine) error {
	if k := giveBackKey(m); k != "" {
		if _, ok := s.norm.recs.pending[k]; ok {
			s.intents = append(s.intents, &intent{kind: intentGiveBack, claim: k, machine: m})
			s.taken[m.Name] = true
			return nil
		}
	}
	// Its give-back is done (or void) and the MachineSet keeps it (it was
	// short of its replicas, or someone raised them): the mark would hold
	// back handing spares over. A reservation it was made for still open
	// takes it (unmarked, it is eligible); for none, it stands in a replica
	// that a later raise is waiting for and can never serve (made before
	// that raise): deleted, as a released Machine is (7. Kept), the
	// MachineSet makes the raise's Machine.
	if !settled(s.cnt, s.r) || s.since("kept/"+m.Name) < keptGrace {
		s.later(keptGrace)
		return nil
	}
	if servesOpen(s.open, m) {
		return s.p.unmark(ctx, m)
	}
	log.FromContext(ctx).Info("deleting a Machine given back that its MachineSet kept", "Machine", client.ObjectKeyFromObject(m))
	if err := s.p.deleteMachine(ctx, m); err != nil && !errors.Is(err, ErrMachineGone) {
		return err
	}
	metrics.OrphansReleased.WithLabelValues("kept").Inc()
	return nil
}

// reservationIntents are steps 4 and 5: reservations no NodeClaim uses
// are given back with a Machine made for them, or, like reservations no
// Machine can serve, handed over once the MachineSet has settled.
func (s *passState) reservationIntents(ctx context.Context) error {
	for _, e := range s.open {
		switch e.state {
		case claimGone:
			if wait := OrphanGrace - s.since("free/"+e.claim); wait > 0 {
				s.later(wait)
				continue
			}
			if s.overBudget() {
				continue
			}
			done, err := s.giveBack(ctx, e)
			if err != nil {
				return err
			}
			if done {
				continue
			}
			if err := s.handOver(ctx, e); err != nil {
				return err
			}
		case claimPending:
			if err := s.handOver(ctx, e); err != nil {
				return err
			}
		}
	}
	return nil
}

// giveBack gives a free reservation back with a Machine made for it, of the
// MachineSet a lowering comes off. It reports whether the reservation is
// dealt with in this pass (given back, or waiting for a rollout).
func (s *passState) giveBack(ctx context.Context, e reservation) (bool, error) {
	if s.low.err != nil || s.c.giveBackVictim(s.candidates, s.taken, e.at) != nil && s.c.giveBackVictim(lowerable(s.candidates, s.low), s.taken, e.at) == nil {
		// A rollout: Cluster API would take the lowering from another
		// MachineSet. The replica stays up (the next NodeClaim may take
		// it) until the rollout lets it go.
		s.later(openRecheck)
		return true, nil
	}
	m := s.c.giveBackVictim(lowerable(s.candidates, s.low), s.taken, e.at)
	if m == nil {
		return false, nil
	}
	if err := s.p.markUnbound(ctx, m, giveBackMark(e.claim)); errors.Is(err, errMachineChanged) {
		s.later(barrierRetry)
		return true, nil
	} else if err != nil {
		return false, err
	}
	s.taken[m.Name] = true
	s.intents = append(s.intents, &intent{kind: intentGiveBack, claim: e.claim, machine: m})
	metrics.OrphansReleased.WithLabelValues("replica").Inc()
	return true, nil
}

// handOver hands a reservation no Machine can serve over (stranded): only
// once the MachineSet has settled (one MachineSet with as many Machines as
// replicas: during a rollout nothing is handed over), decided on a live
// list, as the cache may not show a Machine the MachineSet made lately.
func (s *passState) handOver(ctx context.Context, e reservation) error {
	if !settled(s.cnt, s.r) || s.cnt.marked > 0 || s.low.set != "" || s.low.err != nil || s.now.Sub(e.at) < OrphanGrace {
		s.later(openRecheck)
		return nil
	}
	if s.liveMachines == nil {
		var err error
		if s.liveMachines, err = machinesOf(ctx, s.p.hub.GetAPIReader(), s.md); err != nil {
			return err
		}
	}
	if settled(count(s.liveMachines, nil), s.r) && !eligibleExists(view{machines: s.liveMachines, bindable: s.bindable}, e.at) {
		s.intents = append(s.intents, &intent{kind: intentStranded, claim: e.claim})
	}
	return nil
}

// spareIntent hands over spare replicas nothing accounts for (no marked
// Machine owes them), once the MachineSet has settled.
func (s *passState) spareIntent(context.Context) error {
	if s.spare > 0 && s.cnt.marked == 0 && settled(s.cnt, s.r) && s.low.set == "" && s.low.err == nil {
		if s.since("spare") >= OrphanGrace {
			s.intents = append(s.intents, &intent{kind: intentSpare})
		} else {
			s.later(OrphanGrace)
		}
	}
	return nil
}

// writeRecords sends the pass's intents in one write, with the records the
// objects have overtaken, and acts on what the write decided.
func (s *passState) writeRecords(ctx context.Context) error {
	p := s.p
	if s.onlyLowerings() {
		if wait := p.writer.lowersDue(s.key); wait > 0 {
			// A scale-down: the marks owe these lowerings, and the
			// releases' own write (or the next pass) sends them with the
			// others once the writer's lowerSpacing since the last has
			// passed.
			s.intents = nil
			s.later(wait)
		}
	}
	if !s.recordsDue() {
		return nil
	}
	if err := p.writer.write(ctx, s.key, s.intents); err != nil {
		return err
	}
	for _, in := range s.intents {
		if in.kind == intentLower && deletesDirectly(in.err) && p.claimLeaving(ctx, in.claim) {
			// As Release does: a rollout keeps the lowering off this
			// Machine's MachineSet; exactly it goes, its replica stays
			// Karpenter's (reclaimed for its NodeClaim).
			log.FromContext(ctx).Info("deleting a released Machine: Cluster API would take the lowering off another Machine", "why", in.err.Error(), "Machine", client.ObjectKeyFromObject(in.machine), "NodeClaim", in.claim)
			if err := p.deleteMachine(ctx, in.machine); err != nil && !errors.Is(err, ErrMachineGone) {
				return err
			}
		}
		if in.kind == intentGiveBack && (!in.done || in.atMin) && in.machine != nil {
			// Not given back with it (at min-size the replica passed to
			// whoever set the minimum, or the marks did not cover it): the
			// Machine stays, unmarked.
			if err := p.unmark(ctx, in.machine); err != nil {
				return err
			}
		}
		if in.kind == intentStranded && in.done {
			p.waiters.Notify(in.claim) // its Launch raises again at once
		}
	}
	return nil
}

// onlyLowerings reports whether the pass's intents are all lowerings.
func (s *passState) onlyLowerings() bool {
	for _, in := range s.intents {
		if in.kind != intentLower {
			return false
		}
	}
	return len(s.intents) > 0
}

// recordsDue reports whether the pass writes: it has intents, or records
// the objects have overtaken are written down even when nothing else is: a
// count above the replicas and reservations no replica backs at once (their
// NodeClaims raise again only once they are gone from the records);
// reservations a Machine took up, together, TakeUpDelay after a pass first
// saw one, or TakeUpMaxDelay while the MachineDeployment is still binding
// (the pass bound one, or another reservation waits for its Machine; every
// decision, Launch's included, counts them done meanwhile).
// Stamping alone waits for the next write.
func (s *passState) recordsDue() bool {
	if len(s.intents) > 0 {
		return true
	}
	recs, norm := s.recs, s.norm
	if len(recs.pending)-len(norm.recs.pending) > norm.takenUp || norm.recs.owned != recs.owned || !recs.hasOwned || recs.legacy {
		return true
	}
	if norm.takenUp == 0 {
		return false
	}
	delay := TakeUpDelay
	if s.bound > 0 || s.awaitsMachines() {
		// A burst still binding: its next pass (a binding's own, or
		// openRecheck) looks again; the one after its last binding
		// writes every take-up.
		delay = TakeUpMaxDelay
	}
	if wait := delay - s.since("taken-up"); wait > 0 {
		s.later(wait)
		return false
	}
	delete(s.touched, s.prefix+"taken-up") // written now: the next take-up waits anew
	return true
}

// awaitsMachines reports whether a reservation of a pending NodeClaim is
// still open after the pass bound what it could: a burst still binding.
func (s *passState) awaitsMachines() bool {
	for _, e := range s.open {
		if e.state == claimPending {
			return true
		}
	}
	return false
}

// candidates are the Machines a reservation may be bound to or given back
// with, oldest first: live, unbound, unmarked, with no Node or one that
// awaits registration.
// servesOpen reports whether an open reservation (not bound in this pass)
// could take Machine m: m was made at or after its stamp.
func servesOpen(open []reservation, m *clusterv1.Machine) bool {
	for _, e := range open {
		if e.state != claimLaunched && madeFor(m, e.at) {
			return true
		}
	}
	return false
}

func (c *Controller) candidates(ctx context.Context, machines []*clusterv1.Machine) []*clusterv1.Machine {
	var out []*clusterv1.Machine
	for _, m := range machines {
		if c.bindable(ctx, m) {
			out = append(out, m)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Name < b.Name
	})
	return out
}

// lowerable keeps the Machines a lowering could be covered by a mark on
// (design doc, "Which MachineSet loses a replica").
func lowerable(machines []*clusterv1.Machine, low lowering) []*clusterv1.Machine {
	if low.err != nil {
		return nil
	}
	var out []*clusterv1.Machine
	for _, m := range machines {
		if low.covers(m) {
			out = append(out, m)
		}
	}
	return out
}

// giveBackVictim picks the Machine a free reservation stamped at is given
// back with: made for it, not taken, without a Node first, then the newest.
func (c *Controller) giveBackVictim(candidates []*clusterv1.Machine, taken map[string]bool, at time.Time) *clusterv1.Machine {
	var best *clusterv1.Machine
	for _, m := range candidates {
		if taken[m.Name] || !madeFor(m, at) {
			continue
		}
		if best == nil || (best.Status.NodeRef.IsDefined() && !m.Status.NodeRef.IsDefined()) ||
			(best.Status.NodeRef.IsDefined() == m.Status.NodeRef.IsDefined() && !m.CreationTimestamp.Before(&best.CreationTimestamp)) {
			best = m
		}
	}
	return best
}

// giveBackKey is the reservation an unbound Machine was marked to give back.
func giveBackKey(m *clusterv1.Machine) string {
	v := m.Annotations[clusterv1.DeleteMachineAnnotation]
	rest, ok := strings.CutPrefix(v, markPrefix+": replica of NodeClaim ")
	if !ok {
		return ""
	}
	k, _, _ := strings.Cut(rest, " ")
	return k
}

// bind binds the Machine to the NodeClaim reserved at stamp: the
// NodeClaim is read live first (it exists, is not terminating, has not
// launched), and the patch tests what the decision read of the Machine. A
// Machine changed since is read live, decided on again, and patched on that
// read, up to bindAttempts times.
func (c *Controller) bind(ctx context.Context, m *clusterv1.Machine, claim string, at time.Time) (bindResult, error) {
	nc := &karpv1.NodeClaim{}
	if err := c.spokeAPI.Get(ctx, types.NamespacedName{Name: claim}, nc); err != nil || !nc.DeletionTimestamp.IsZero() || nc.Status.ProviderID != "" {
		return claimDone, client.IgnoreNotFound(err)
	}
	p := c.provider
	cur := m
	for attempt := 0; attempt < bindAttempts; attempt++ {
		patch, err := bindPatch(cur, claim)
		if err != nil {
			return machineRefused, err
		}
		target := cur.DeepCopy()
		err = p.hub.GetClient().Patch(ctx, target, patch, client.FieldOwner(FieldManager))
		if err == nil {
			p.barrier.recordBind(claim, target)
			log.FromContext(ctx).Info("bound Machine to NodeClaim", "Machine", client.ObjectKeyFromObject(m), "NodeClaim", claim,
				"machineCreated", m.CreationTimestamp.UTC().Format(time.RFC3339), "reserved", at.UTC().Format(time.RFC3339))
			if c.hubEvents != nil {
				c.hubEvents.Event(target, corev1.EventTypeNormal, "Bound", fmt.Sprintf("bound to NodeClaim %s (replica raised at %s, Machine created %s)",
					claim, at.UTC().Format(time.RFC3339), m.CreationTimestamp.UTC().Format(time.RFC3339)))
			}
			if c.spokeEvents != nil {
				c.spokeEvents.Event(nc, corev1.EventTypeNormal, "MachineBound", fmt.Sprintf("Machine %s/%s of MachineDeployment %s bound",
					m.Namespace, m.Name, m.Labels[clusterv1.MachineDeploymentNameLabel]))
			}
			p.waiters.Notify(claim)
			failpoint.Crash(StepBind)
			return bound, nil
		}
		if apierrors.IsNotFound(err) {
			return machineRefused, nil
		}
		if !changedSinceRead(err) {
			return machineRefused, fmt.Errorf("binding Machine %s/%s to NodeClaim %s: %w", m.Namespace, m.Name, claim, err)
		}
		live := &clusterv1.Machine{}
		if err := p.hub.GetAPIReader().Get(ctx, client.ObjectKeyFromObject(m), live); err != nil {
			if apierrors.IsNotFound(err) {
				return machineRefused, nil
			}
			return machineRefused, fmt.Errorf("reading Machine %s/%s: %w", m.Namespace, m.Name, err)
		}
		if live.UID != m.UID || !c.bindable(ctx, live) || !madeFor(live, at) {
			return machineRefused, nil
		}
		cur = live
	}
	return machineRefused, nil
}

// reportUnowned counts the live, unbound, unmarked Machines of a member
// MachineDeployment older than OrphanGrace that no open reservation can use
// once its MachineSet has settled: paid nodes that run no pod (they joined
// with Karpenter's unregistered taint, which only a NodeClaim removes). It
// returns how soon the youngest unbound Machine comes of age (0: none is
// waiting): nothing else may wake the pass once the MachineSet settled.
func (c *Controller) reportUnowned(md *clusterv1.MachineDeployment, machines []*clusterv1.Machine, open []reservation, isSettled bool, now time.Time) time.Duration {
	if !isSettled {
		return 0 // the last report stands until the MachineSet settles
	}
	n := 0
	var wait time.Duration
	for _, m := range machines {
		if !m.DeletionTimestamp.IsZero() || isMarked(m) || m.Annotations[v1alpha1.NodeClaimAnnotation] != "" {
			continue
		}
		if young := OrphanGrace - now.Sub(m.CreationTimestamp.Time); young > 0 {
			if wait == 0 || young < wait {
				wait = young
			}
			continue
		}
		usable := false
		for _, e := range open {
			if e.state == claimPending && madeFor(m, e.at) {
				usable = true
				break
			}
		}
		if !usable {
			n++
		}
	}
	metrics.UnownedMachines.WithLabelValues(md.Namespace, md.Name).Set(float64(n))
	if c.unowned.changed(client.ObjectKeyFromObject(md), n) && n > 0 && c.hubEvents != nil {
		c.hubEvents.Event(md, corev1.EventTypeWarning, "UnownedMachines", fmt.Sprintf(
			"%d Machine(s) of this member MachineDeployment belong to no NodeClaim: their nodes keep Karpenter's unregistered taint and run no pod; lower spec.replicas by that many, or remove the member label (see docs/troubleshooting.md)", n))
	}
	return wait
}

// reservation is one reservation as a pass sees it.
type reservation struct {
	claim string
	at    time.Time
	state claimState
}

// unownedReport remembers the count last reported per MachineDeployment,
// so that an event is recorded when it changes, not at every pass.
type unownedReport struct {
	mu   sync.Mutex
	last map[types.NamespacedName]int
}

func (u *unownedReport) changed(key types.NamespacedName, n int) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.last == nil {
		u.last = map[types.NamespacedName]int{}
	}
	old, ok := u.last[key]
	u.last[key] = n
	return !ok && n > 0 || ok && old != n
}
