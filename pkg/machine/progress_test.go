package machine

import (
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

var (
	offA = instancetype.OfferingKey{InstanceType: "m5.large", Zone: "us-east-1a", CapacityType: "on-demand"}
	offB = instancetype.OfferingKey{InstanceType: "m5.large", Zone: "us-east-1b", CapacityType: "on-demand"}
	offC = instancetype.OfferingKey{InstanceType: "c5.large", Zone: "us-east-1a", CapacityType: "spot"}
)

func TestProgressTellsAStalledOfferingFromAQueue(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)
	now := t0.Add(3 * time.Minute)
	cases := []struct {
		name  string
		setup func(p *progress)
		want  verdict
	}{
		{"alone: nothing else awaited, nothing delivered", func(p *progress) { p.await("x") }, verdictAlone},
		{"queued: a burst, others wait too, nothing delivered yet", func(p *progress) {
			p.await("x")
			p.await("y")
		}, verdictQueued},
		{"queued: later launches of its own offering got IDs first (out of order)", func(p *progress) {
			p.await("x")
			p.await("y")
			p.deliver(offA, t0.Add(time.Minute), t0.Add(2*time.Minute))
		}, verdictQueued},
		{"overtaken: another offering's launch made a minute later got its ID long ago, its own none since", func(p *progress) {
			p.await("x")
			p.await("y")
			p.deliver(offB, t0.Add(time.Minute), t0.Add(2*time.Minute))
		}, verdictOvertaken},
		{"not overtaken: the other launch was made only seconds later (a queue is roughly in order)", func(p *progress) {
			p.await("x")
			p.await("y")
			p.deliver(offB, t0.Add(10*time.Second), t0.Add(2*time.Minute))
		}, verdictQueued},
		{"not overtaken: the other launch got its ID just now (this one may be in the works)", func(p *progress) {
			p.await("x")
			p.await("y")
			p.deliver(offB, t0.Add(time.Minute), now.Add(-5*time.Second))
		}, verdictQueued},
		{"not overtaken: its own offering delivered since it was made", func(p *progress) {
			p.await("x")
			p.await("y")
			p.deliver(offB, t0.Add(time.Minute), t0.Add(2*time.Minute))
			p.deliver(offA, t0.Add(-time.Minute), t0.Add(90*time.Second))
		}, verdictQueued},
		{"alone after the others finished", func(p *progress) {
			p.await("x")
			done := p.await("y")
			done()
		}, verdictAlone},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newProgress()
			c.setup(p)
			if got := p.judge("x", offA, t0, now); got != c.want {
				t.Fatalf("verdict %q, want %q", got, c.want)
			}
		})
	}
}

// A seeded, randomized hunt for a broken invariant of the judgement. Each
// seed is a burst of launches over three offerings (in half the seeds one
// of them has a single launch), made within two minutes, served by an infrastructure provider's workers roughly in the
// order their bootstrap data became ready (up to overtakeMargin/2 of
// jitter), each taking a random time; in half the seeds one offering
// stalls (never served). Every launch past LaunchTimeout is judged every
// 10 s, as await does. Invariants:
//
//   - a launch of an offering that does not stall is never failed while
//     another launch is awaited (a queue never leaves an offering out);
//   - a launch of the stalled offering is failed by its timeout plus a
//     minute whenever another offering's launch made more than a minute
//     after it was delivered by then.
//
// MACHINE_PROGRESS_SEEDS sets how many seeds (default 200).
func TestProgressRandomizedQueues(t *testing.T) {
	seeds := 200
	if v, err := strconv.Atoi(os.Getenv("MACHINE_PROGRESS_SEEDS")); err == nil && v > 0 {
		seeds = v
	}
	for seed := int64(1); seed <= int64(seeds); seed++ {
		if msg := runQueue(seed); msg != "" {
			t.Fatalf("seed %d: %s", seed, msg)
		}
	}
	if judgedTotal < seeds {
		t.Fatalf("%d judgements in %d seeds: the queues never reach the timeout", judgedTotal, seeds)
	}
	t.Logf("%d seeds, %d judgements past the timeout", seeds, judgedTotal)
}

type simLaunch struct {
	claim     string
	offering  instancetype.OfferingKey
	made      time.Time
	ready     time.Time // bootstrap data ready: the provider may take it
	done      time.Time // the provider finishes it (zero: never)
	delivered bool
	failed    bool
	stop      func()
	judged    time.Duration // how long past the timeout it was judged last
}

func runQueue(seed int64) string {
	r := rand.New(rand.NewSource(seed))
	t0 := time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)
	offerings := []instancetype.OfferingKey{offA, offB, offC}
	stalled := instancetype.OfferingKey{}
	if r.Intn(2) == 0 {
		stalled = offerings[r.Intn(len(offerings))]
	}
	n := 50 + r.Intn(900)
	workers := 1 + r.Intn(4)
	p := newProgress()
	launches := make([]*simLaunch, n)
	// In half the seeds one offering has a single launch (one NodeClaim
	// that needs it in a burst of others): no sibling shows it flows.
	rare, single := -1, -1
	if r.Intn(2) == 0 {
		rare, single = r.Intn(len(offerings)), r.Intn(n)
	}
	pick := func(i int) instancetype.OfferingKey {
		if i == single {
			return offerings[rare]
		}
		for {
			if o := r.Intn(len(offerings)); o != rare {
				return offerings[o]
			}
		}
	}
	for i := range launches {
		made := t0.Add(time.Duration(r.Int63n(int64(2 * time.Minute))))
		l := &simLaunch{claim: fmt.Sprintf("c%d", i), offering: pick(i), made: made,
			ready: made.Add(time.Duration(r.Int63n(int64(overtakeMargin / 2))))}
		launches[i] = l
	}
	// The provider's workers take launches in the order they became ready.
	order := append([]*simLaunch(nil), launches...)
	sort.Slice(order, func(i, j int) bool { return order[i].ready.Before(order[j].ready) })
	free := make([]time.Time, workers)
	for _, l := range order {
		if l.offering == stalled {
			continue // taken, and never finished
		}
		w := 0
		for i := range free {
			if free[i].Before(free[w]) {
				w = i
			}
		}
		start := l.ready
		if free[w].After(start) {
			start = free[w]
		}
		l.done = start.Add(time.Duration(100+r.Intn(1900)) * time.Millisecond)
		free[w] = l.done
	}
	timeout := DefaultLaunchTimeout
	end := t0.Add(2*time.Minute + 5*time.Minute) // core's launch timeout ends every wait
	judgements := 0
	for now := t0; !now.After(end); now = now.Add(time.Second) {
		for _, l := range launches {
			if l.stop == nil && !l.made.After(now) && !l.delivered && !l.failed {
				l.stop = p.await(l.claim)
			}
		}
		for _, l := range launches {
			if !l.delivered && !l.failed && !l.done.IsZero() && !l.done.After(now) && l.stop != nil {
				l.delivered = true
				p.deliver(l.offering, l.made, l.done)
				l.stop()
			}
		}
		for _, l := range launches {
			if l.delivered || l.failed || l.stop == nil || now.Before(l.made.Add(timeout).Add(l.judged)) {
				continue
			}
			l.judged += time.Second // events wake a waiting launch often; queuedRecheck is the longest gap
			judgements++
			v := p.judge(l.claim, l.offering, l.made, now)
			if !v.failed() {
				continue
			}
			others := 0
			for _, o := range launches {
				if o != l && o.stop != nil && !o.delivered && !o.failed {
					others++
				}
			}
			if l.offering != stalled && others > 0 {
				return fmt.Sprintf("launch %s of %v (made %s, provider done %s) failed at %s as %q while %d others waited (%d launches, %d workers): a queue left an offering out",
					l.claim, l.offering, l.made.Sub(t0), l.done.Sub(t0), now.Sub(t0), v, others, n, workers)
			}
			l.failed = true
			l.stop()
		}
		for _, l := range launches {
			if l.offering != stalled || l.failed || l.stop == nil || now.Sub(l.made) < timeout+time.Minute {
				continue
			}
			for _, o := range launches {
				if o.offering != stalled && o.delivered && o.made.Sub(l.made) > time.Minute && now.Sub(o.done) > overtakeMargin {
					return fmt.Sprintf("launch %s of the stalled offering %v not failed %s after it was made, though %s of %v made %s later got its ID at %s",
						l.claim, l.offering, now.Sub(l.made), o.claim, o.offering, o.made.Sub(l.made), o.done.Sub(t0))
				}
			}
		}
	}
	judgedTotal += judgements
	return ""
}

// judgedTotal counts the judgements of all seeds: a hunt that never judges
// proves nothing.
var judgedTotal int
