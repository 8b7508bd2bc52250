package machine

import (
	"sync"
	"time"

	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

// progress tells a stalled offering from a queue. A Machine without an
// instance ID after LaunchTimeout, with no failure reported by the
// infrastructure, is either stuck on its offering (then Karpenter should
// relaunch elsewhere) or waiting behind others in the infrastructure
// provider's queue (a burst of hundreds; then relaunching elsewhere only
// doubles the queue and leaves good offerings out). It decides with what
// this process saw of the launches it awaits (see the protocol in
// docs/design/machine-launch.md):
//
//  1. overtaken: a launch of another offering made after the Machine got
//     its ID, and no launch of the Machine's offering got one since the
//     Machine was made: its offering stalls while others flow. Failed.
//  2. queued: other launches await their IDs too. It waits; Karpenter's
//     own launch timeout bounds the wait (the NodeClaim is deleted, its
//     Machine with it, and no offering is left out).
//  3. alone: nothing else is awaited and nothing overtook it. Failed.
type progress struct {
	mu sync.Mutex
	// delivered per offering: when one of its launches last got its ID,
	// and the newest creation time among its launches that got one.
	delivered map[instancetype.OfferingKey]delivery
	// awaiting are the launches waiting for an ID in this process.
	awaiting map[string]bool
}

type delivery struct {
	lastAt, newestMade time.Time
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
		return "overtaken"
	case verdictQueued:
		return "queued"
	default:
		return "alone"
	}
}

func newProgress() *progress {
	return &progress{delivered: map[instancetype.OfferingKey]delivery{}, awaiting: map[string]bool{}}
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
// now.
func (p *progress) deliver(o instancetype.OfferingKey, made, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.delivered[o]
	if now.After(d.lastAt) {
		d.lastAt = now
	}
	if made.After(d.newestMade) {
		d.newestMade = made
	}
	p.delivered[o] = d
}

// judge decides about the launch for claim of offering o, made at made,
// that has gone LaunchTimeout without an ID.
func (p *progress) judge(claim string, o instancetype.OfferingKey, made time.Time) verdict {
	p.mu.Lock()
	defer p.mu.Unlock()
	own := p.delivered[o]
	if !own.lastAt.After(made) {
		for other, d := range p.delivered {
			if other != o && d.newestMade.After(made) {
				return verdictOvertaken
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
