package machine

import (
	"testing"
	"time"

	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

func TestProgressTellsAStalledOfferingFromAQueue(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)
	a := instancetype.OfferingKey{InstanceType: "m5.large", Zone: "us-east-1a", CapacityType: "on-demand"}
	b := instancetype.OfferingKey{InstanceType: "m5.large", Zone: "us-east-1b", CapacityType: "on-demand"}
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
		{"queued: others of its offering made later got IDs (out of order), more wait", func(p *progress) {
			p.await("x")
			p.await("y")
			p.deliver(a, t0.Add(time.Minute), t0.Add(2*time.Minute))
		}, verdictQueued},
		{"overtaken: another offering's later launch got its ID, its own none since", func(p *progress) {
			p.await("x")
			p.await("y")
			p.deliver(b, t0.Add(time.Minute), t0.Add(2*time.Minute))
		}, verdictOvertaken},
		{"not overtaken: its own offering delivered since it was made", func(p *progress) {
			p.await("x")
			p.await("y")
			p.deliver(b, t0.Add(time.Minute), t0.Add(2*time.Minute))
			p.deliver(a, t0.Add(-time.Minute), t0.Add(90*time.Second))
		}, verdictQueued},
		{"not overtaken: the other offering's delivered launch is older than it", func(p *progress) {
			p.await("x")
			p.await("y")
			p.deliver(b, t0.Add(-time.Minute), t0.Add(2*time.Minute))
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
			if got := p.judge("x", a, t0); got != c.want {
				t.Fatalf("verdict %s, want %s", got, c.want)
			}
			if got, want := p.judge("x", a, t0).failed(), c.want != verdictQueued; got != want {
				t.Fatalf("failed() = %v, want %v", got, want)
			}
		})
	}
}
