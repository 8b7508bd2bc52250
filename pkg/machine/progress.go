package machine

import (
	"sync"
	"time"

	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

// overtakeMargin is how much later another offering's launch must have been
// made, and how long ago it must have got its ID, to count as overtaking:
// an infrastructure provider's queue is only roughly first in, first out
// (its workers run side by side, a launch waits for its bootstrap data), so
// a launch made a little later, or one that just finished while this one is
// being worked on, says nothing about this one's offering.
const overtakeMargin = 30 * time.Second

// deliveryMemory is how long deliveries are remembered: longer than
// Karpenter core's launch timeout, beyond which no launch waits.
const deliveryMemory = 10 * time.Minute

// progress tells a stalled offering from a queue. A Machine without an
// instance ID after LaunchTimeout, with no failure reported by the
// infrastructure, is either stuck on its offering (then Karpenter should
// relaunch elsewhere) or waiting behind others in the infrastructure
// provider's queue (a burst of hundreds; then relaunching elsewhere only
// doubles the queue and leaves good offerings out). It decides with what
// this process saw of the launches it awaits (the protocol is in
// docs/design/machine-launch.md):
//
//  1. overtaken: another offering's launch made more than overtakeMargin
//     after this one got its ID more than overtakeMargin ago, and no launch
//     of this one's offering got one since this one was made: its offering
//     stalls while others flow. Failed.
//  2. queued: other launches await their IDs too. It waits; Karpenter's
//     own launch timeout bounds the wait (the NodeClaim is deleted, its
//     Machine with it, and no offering is left out).
//  3. alone: nothing else is awaited and nothing overtook it. Failed.
type progress struct {
	mu        sync.Mutex
	delivered map[instancetype.OfferingKey][]delivery
	// awaiting are the launches waiting for an ID in this process.
	awaiting map[string]bool
}

// delivery is one launch that got its ID: when it was made, and when.
type delivery struct {
	made, at time.Time
}

// verdict of a launch past LaunchTimeout.
type verdict int

const (
	verdictAlone verdict = iota
	verdictOvertaken
	verdictQueued
)

func (v verdict) failed() bool { return v != verdictQueued }

func (v verdict) String() string {
	switch v {
	case verdictOvertaken:
		return "overtaken by another offering's launches"
	case verdictQueued:
		return "queued behind other launches"
	default:
		return "no other launch in progress"
	}
}

func newProgress() *progress {
	return &progress{delivered: map[instancetype.OfferingKey][]delivery{}, awaiting: map[string]bool{}}
}

// await records that the launch for claim waits for its ID; the returned
// func records that it stopped waiting.
func (p *progress) await(claim string) func() {
	p.mu.Lock()
	p.awaiting[claim] = true
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		delete(p.awaiting, claim)
		p.mu.Unlock()
	}
}

// deliver records that a launch of offering o, made at made, got its ID at
// at, and forgets deliveries older than deliveryMemory.
func (p *progress) deliver(o instancetype.OfferingKey, made, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ds := p.delivered[o]
	keep := 0
	for keep < len(ds) && at.Sub(ds[keep].at) > deliveryMemory {
		keep++
	}
	p.delivered[o] = append(ds[keep:], delivery{made: made, at: at})
}

// judge decides, at now, about the launch for claim of offering o, made at
// made, that has gone LaunchTimeout without an ID.
func (p *progress) judge(claim string, o instancetype.OfferingKey, made, now time.Time) verdict {
	p.mu.Lock()
	defer p.mu.Unlock()
	ownSince := false
	for _, d := range p.delivered[o] {
		if d.at.After(made) {
			ownSince = true
			break
		}
	}
	if !ownSince {
		for other, ds := range p.delivered {
			if other == o {
				continue
			}
			for _, d := range ds {
				if d.made.Sub(made) > overtakeMargin && now.Sub(d.at) > overtakeMargin {
					return verdictOvertaken
				}
			}
		}
	}
	for c := range p.awaiting {
		if c != claim {
			return verdictQueued
		}
	}
	return verdictAlone
}
