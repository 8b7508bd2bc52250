package machinedeployment

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

// ErrAtMaxSize refuses a reservation that would raise a MachineDeployment
// past its max-size annotation.
var ErrAtMaxSize = errors.New("at its max size (" + instancetype.MaxSizeAnnotation + ")")

// sizeBound reads a min-size or max-size annotation; ok is false when absent.
func sizeBound(md *clusterv1.MachineDeployment, key string) (n int32, ok bool, err error) {
	raw, ok := md.Annotations[key]
	if !ok {
		return 0, false, nil
	}
	v, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 32)
	if err != nil || v < 0 {
		return 0, false, fmt.Errorf("MachineDeployment %s/%s: annotation %q is %q, not a non-negative integer", md.Namespace, md.Name, key, raw)
	}
	return int32(v), true, nil
}

// op is one change to a MachineDeployment's replicas and bookkeeping. Each
// op is idempotent: it says which entry to add or remove and changes
// replicas only when the entry actually changes, so a retried, repeated or
// resumed op never counts twice.
type op struct {
	kind  opKind
	name  string // NodeClaim or Machine name
	since time.Time
	// claim is the NodeClaim an opRelease's Machine is bound to.
	claim string
	// bound is the number of bound Machines an opSetOwned counts.
	bound int32
	// expect is the owned-replicas count an opSetOwned, opSpare or
	// opForgive was decided on: it applies only while the count is still
	// that (-1 for opSetOwned: only while there is no count), so that a
	// decision made on a stale read is never applied twice.
	expect int32
	// err is set by applyOps when the op was refused (a reservation past
	// max-size); kept when a give-back left spec.replicas at min-size.
	err  error
	kept bool
	// took is set by applyOps when an opReserve took a held replica, or
	// the reservation of a NodeClaim that is gone (from), instead of
	// raising one.
	took bool
	from string
	// pendingAt is the set of reservations an opSpare or opForgive was
	// decided on: it applies only while no reservation has been added
	// since (an opReclaim the decision's read did not show uses the
	// replica it would give back).
	pendingAt map[string]bool
	// marked is the Machine an opSpare's decision marked to give the
	// replica back with; reclaimed is set by applyOps when the opSpare was
	// refused because a reservation added since uses the replica, so that
	// the mark comes off (the Machine may serve that reservation).
	marked    *clusterv1.Machine
	reclaimed bool
	// done is set by applyOps when an opReclaim, opLost, opHold or opGiveBackHeld changed
	// the MachineDeployment (a retry, or one decided on a stale read,
	// may find nothing to do).
	done    bool
	applied chan error
}

type opKind int

const (
	// opReserve reserves a replica for a NodeClaim (pending += claim): a
	// held replica when there is one (the oldest; the reservation takes its
	// raise time, replicas and owned unchanged), else the reservation of a
	// NodeClaim that is gone (the same way: see takeovers), else a raise
	// by one.
	opReserve opKind = iota
	// opBound drops a NodeClaim that a Machine is now bound to (pending -= claim).
	opBound
	// opGiveBack lowers replicas for a NodeClaim that never got a Machine.
	opGiveBack
	// opRelease lowers replicas for a Machine marked for deletion. With
	// claim set, it also drops that NodeClaim's reservation when the
	// reservation is the one the Machine was made for (raised no later
	// than since: the Machine's creation plus bindSkew), so that one
	// replica is never given back twice, once with the Machine and once
	// more for the reservation when the NodeClaim is gone (model seeds 30,
	// 48). The drop rides only on the first release of the Machine: a
	// retried release never drops a reservation raised since.
	opRelease
	// opForget drops a released Machine that is gone.
	opForget
	// opSetOwned sets the owned-replicas count to bound + pending + held.
	opSetOwned
	// opSpare gives back an owned replica no NodeClaim uses (its Machine
	// was deleted by someone else): replicas and owned minus one.
	opSpare
	// opForgive drops an owned replica someone else already took away
	// (lowered replicas): owned minus one, replicas unchanged.
	opForgive
	// opLost drops a reservation whose replica someone else took away
	// before a Machine was bound to it: pending -= claim, owned minus one,
	// replicas unchanged.
	opLost
	// opHold keeps the replica of a NodeClaim that went away before a
	// Machine was bound to it for the next reservation: pending -= claim,
	// held += claim (raised then, held at since), replicas and owned
	// unchanged.
	opHold
	// opGiveBackHeld gives back a held replica no reservation took:
	// held -= name, replicas and owned minus one.
	opGiveBackHeld
	// opReclaim reserves for a NodeClaim the replica of the Machine bound
	// to it that someone else deleted before it launched (lostMachines):
	// pending += claim, raised at since (the lost Machine's creation, so a
	// Machine made since, such as the one the MachineSet kept in its place,
	// is bindable), replicas and owned unchanged: the replica is up and
	// Karpenter's already.
	opReclaim
)

// Scaler applies ops to MachineDeployments. Ops for one MachineDeployment
// that arrive while an update is in flight are merged into the next update,
// so a burst of NodeClaims costs one write per MachineDeployment, not one
// per NodeClaim. Updates carry the resourceVersion they read (optimistic
// concurrency) and are re-applied to a fresh read on conflict, so a replica
// change someone else makes at the same time is never overwritten.
type Scaler struct {
	writer client.Client
	reader client.Reader // live reads after a conflict
	cache  client.Reader
	// Observe, when set, is told the size of each batch written.
	Observe func(batchSize int)
	// OnError, when set, is told of each failed write.
	OnError func(error)
	// Gone, when set, finds for one write the reservations of NodeClaims
	// that are gone, which a new reservation takes over (see takeovers).
	Gone func(ctx context.Context) *goneClaims

	mu     sync.Mutex
	queues map[types.NamespacedName]*queue
}

type queue struct {
	ops     []*op
	running bool
}

// NewScaler returns a scaler that reads from cache, writes with writer and
// re-reads live from reader on conflict.
func NewScaler(writer client.Client, cache, reader client.Reader) *Scaler {
	return &Scaler{writer: writer, cache: cache, reader: reader, queues: map[types.NamespacedName]*queue{}}
}

// Apply queues ops for a MachineDeployment and waits until they are written.
func (s *Scaler) Apply(ctx context.Context, md types.NamespacedName, ops ...*op) error {
	for _, o := range ops {
		o.applied = make(chan error, 1)
	}
	s.mu.Lock()
	q := s.queues[md]
	if q == nil {
		q = &queue{}
		s.queues[md] = q
	}
	q.ops = append(q.ops, ops...)
	if !q.running {
		q.running = true
		go s.drain(md, q)
	}
	s.mu.Unlock()
	for _, o := range ops {
		select {
		case err := <-o.applied:
			if err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (s *Scaler) drain(key types.NamespacedName, q *queue) {
	for {
		s.mu.Lock()
		batch := q.ops
		q.ops = nil
		if len(batch) == 0 {
			q.running = false
			delete(s.queues, key)
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := s.write(ctx, key, batch)
		cancel()
		if err != nil && s.OnError != nil {
			s.OnError(err)
		}
		for _, o := range batch {
			if err == nil {
				o.applied <- o.err
				continue
			}
			o.applied <- err
		}
	}
}

func (s *Scaler) write(ctx context.Context, key types.NamespacedName, batch []*op) error {
	md := &clusterv1.MachineDeployment{}
	if err := s.cache.Get(ctx, key, md); err != nil {
		return fmt.Errorf("reading MachineDeployment %s: %w", key, err)
	}
	for attempt := 0; ; attempt++ {
		var gone *goneClaims
		if s.Gone != nil {
			gone = s.Gone(ctx)
		}
		changed, err := applyOps(md, batch, gone)
		if err != nil || !changed {
			gone.settle(batch, false)
			return err
		}
		err = s.writer.Update(ctx, md)
		gone.settle(batch, err == nil)
		if err == nil {
			if s.Observe != nil {
				s.Observe(len(batch))
			}
			return nil
		}
		if !apierrors.IsConflict(err) || attempt >= 10 {
			return fmt.Errorf("updating MachineDeployment %s: %w", key, err)
		}
		md = &clusterv1.MachineDeployment{}
		if err := s.reader.Get(ctx, key, md); err != nil {
			return fmt.Errorf("reading MachineDeployment %s: %w", key, err)
		}
	}
}

// applyOps changes md in place and reports whether anything changed. gone,
// when not nil, offers reservations of NodeClaims that are gone for a new
// reservation to take over instead of raising.
func applyOps(md *clusterv1.MachineDeployment, batch []*op, gone *goneClaims) (bool, error) {
	for _, o := range batch { // a retry after a conflict decides afresh
		o.err, o.kept, o.took, o.done, o.from, o.reclaimed = nil, false, false, false, "", false
	}
	pending, err := hub.PendingNodeClaims(md)
	if err != nil {
		// Never build on a value we cannot read: refuse and say why.
		return false, err
	}
	released, err := hub.ReleasedMachines(md)
	if err != nil {
		return false, err
	}
	held, err := heldReplicas(md)
	if err != nil {
		return false, err
	}
	// A malformed count reads as none: the controller sets it again.
	owned, hasOwned, _ := ownedReplicas(md)
	ownedBefore, hadOwned := owned, hasOwned
	replicas := int32(0)
	if md.Spec.Replicas != nil {
		replicas = *md.Spec.Replicas
	}
	before := replicas
	maxSize, hasMax, maxErr := sizeBound(md, instancetype.MaxSizeAnnotation)
	minSize, _, _ := sizeBound(md, instancetype.MinSizeAnnotation) // malformed: no minimum
	// lower gives one replica back, unless that would go below min-size:
	// the replica then passes to whoever set the minimum (owned-1 only).
	lower := func(o *op) {
		if replicas-1 < minSize || (hasOwned && owned <= 0) {
			// At min-size, or no replica is Karpenter's by the count
			// (someone else lowered them already): lowering would take a
			// replica that is not ours.
			o.kept = true
			return
		}
		replicas = max(replicas-1, 0)
	}
	changed := false
	for _, o := range batch {
		switch o.kind {
		case opReserve:
			if _, ok := pending[o.name]; !ok {
				if h := oldestHeld(held); h != "" {
					// No raise: the replica is up already and its
					// Machine may be made; one made for its raise
					// may be bound to this claim.
					pending[o.name] = held[h].Raised
					delete(held, h)
					o.took = true
					changed = true
					continue
				}
				if c := gone.pick(pending, o.name); c != "" {
					// The replica is up already, raised for a NodeClaim
					// that is gone (Karpenter's launch timeout): the
					// Machine made for it is this claim's.
					pending[o.name] = pending[c]
					delete(pending, c)
					o.took, o.from = true, c
					changed = true
					continue
				}
				// Max-size is enforced here, on the replicas this very
				// update writes, so a batch never raises past it.
				if maxErr != nil || (hasMax && replicas+1 > maxSize) {
					o.err = fmt.Errorf("MachineDeployment %s/%s: %w", md.Namespace, md.Name, ErrAtMaxSize)
					if maxErr != nil {
						o.err = fmt.Errorf("%w: %w", o.err, maxErr)
					}
					continue
				}
				pending[o.name] = o.since.UTC().Truncate(time.Second)
				replicas++
				owned++
				changed = true
			}
		case opReclaim:
			if _, ok := pending[o.name]; !ok {
				pending[o.name] = o.since.UTC().Truncate(time.Second)
				changed, o.done = true, true
			}
		case opBound:
			if _, ok := pending[o.name]; ok {
				delete(pending, o.name)
				changed = true
			}
		case opGiveBack:
			if _, ok := pending[o.name]; ok {
				delete(pending, o.name)
				lower(o)
				owned--
				changed = true
			}
		case opRelease:
			if !released[o.name] {
				released[o.name] = true
				lower(o)
				owned--
				changed = true
				if raised, ok := pending[o.claim]; ok && o.claim != "" && !raised.After(o.since) {
					delete(pending, o.claim)
				}
			}
		case opForget:
			if released[o.name] {
				delete(released, o.name)
				changed = true
			}
		case opSetOwned:
			if (o.expect < 0 && !hasOwned) || (o.expect >= 0 && hasOwned && owned == o.expect) {
				owned, hasOwned = o.bound+int32(len(pending))+int32(len(held)), true
				changed = true
			}
		case opSpare:
			if hasOwned && owned == o.expect && owned > 0 {
				if reservedSince(pending, o.pendingAt) {
					o.reclaimed = true
					continue
				}
				lower(o)
				owned--
				changed = true
			}
		case opLost:
			// Only while the replicas are still below the owned count,
			// checked on the count this write leaves: several stranded
			// reservations decided in one pass on one read must not drop
			// more than someone else took away (model seed 109: eleven
			// dropped for a deficit of one, handing ten replicas to
			// others).
			if _, ok := pending[o.name]; ok && (!hasOwned || replicas < owned) {
				delete(pending, o.name)
				if hasOwned && owned > 0 {
					owned--
				}
				changed, o.done = true, true
			}
		case opHold:
			if raised, ok := pending[o.name]; ok {
				delete(pending, o.name)
				held[o.name] = heldReplica{Raised: raised, Held: o.since.UTC().Truncate(time.Second)}
				changed, o.done = true, true
			}
		case opGiveBackHeld:
			if _, ok := held[o.name]; ok {
				delete(held, o.name)
				lower(o)
				owned--
				changed, o.done = true, true
			}
		case opForgive:
			if hasOwned && owned == o.expect && owned > 0 && !reservedSince(pending, o.pendingAt) {
				owned--
				changed = true
			}
		}
	}
	if !changed {
		return false, nil
	}
	hub.SetPendingNodeClaims(md, pending)
	hub.SetReleasedMachines(md, released)
	setHeldReplicas(md, held)
	if hasOwned && (!hadOwned || owned != ownedBefore) {
		setOwnedReplicas(md, owned)
	}
	if replicas != before {
		md.Spec.Replicas = &replicas
	}
	return true, nil
}

// reservedSince reports whether pending holds a reservation that was not
// there when a decision read the reservations at (nil: not checked).
func reservedSince(pending map[string]time.Time, at map[string]bool) bool {
	if at == nil {
		return false
	}
	for c := range pending {
		if !at[c] {
			return true
		}
	}
	return false
}
