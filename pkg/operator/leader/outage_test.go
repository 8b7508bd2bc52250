package leader

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

type fakeLock struct {
	resourcelock.Interface
	err error
}

func (f *fakeLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	return &resourcelock.LeaderElectionRecord{}, nil, f.err
}

// The watch reports an outage longer than the threshold once, when the API
// server answers again; short outages and answers that are errors of the
// API server itself are no outage.
func TestOutageWatch(t *testing.T) {
	now := time.Unix(0, 0)
	var reported []time.Duration
	lock := &fakeLock{}
	w := &outageWatch{Interface: lock, threshold: 6 * time.Second, now: func() time.Time { return now }, back: func(d time.Duration) { reported = append(reported, d) }}
	get := func(err error, after time.Duration) {
		now = now.Add(after)
		lock.err = err
		_, _, _ = w.Get(context.Background())
	}
	refused := &wrappedErr{syscall.ECONNREFUSED}
	get(nil, 0)
	get(refused, time.Second)
	get(refused, 3*time.Second)
	get(nil, time.Second) // down 4 s: shorter than the threshold
	if len(reported) != 0 {
		t.Fatalf("a 4 s outage was reported: %v", reported)
	}
	get(refused, time.Second)
	for i := 0; i < 10; i++ {
		get(refused, time.Second)
	}
	get(errors.New("forbidden-ish answer"), time.Second) // neither up nor down
	get(nil, time.Second)
	get(nil, time.Second)
	if len(reported) != 1 || reported[0] != 12*time.Second {
		t.Fatalf("want one 12s outage reported, got %v", reported)
	}
}

type wrappedErr struct{ err error }

func (e *wrappedErr) Error() string { return "dial tcp 127.0.0.1:1: connect: " + e.err.Error() }
func (e *wrappedErr) Unwrap() error { return e.err }
