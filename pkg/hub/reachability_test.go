package hub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestUnreachable(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("updating MachineDeployment default/a: %w", refused), true},
		{apierrors.NewServiceUnavailable("starting"), true},
		{apierrors.NewTooManyRequests("slow down", 1), true},
		{apierrors.NewInternalError(errors.New("etcd")), true},
		{apierrors.NewTimeoutError("x", 1), true},
		{apierrors.NewGenericServerResponse(502, "get", schema.GroupResource{Resource: "machines"}, "m", "bad gateway", 0, true), true},
		{fmt.Errorf("get: %w", &net.DNSError{Err: "no such host", Name: "hub.example", IsNotFound: true}), true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.EHOSTUNREACH}}, true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ENETUNREACH}}, true},
		{fmt.Errorf("list: %w", context.DeadlineExceeded), true},
		{apierrors.NewBadRequest("bad"), false},
		{apierrors.NewNotFound(schema.GroupResource{Resource: "machines"}, "m"), false},
		{apierrors.NewConflict(schema.GroupResource{Resource: "machines"}, "m", errors.New("x")), false},
		{apierrors.NewForbidden(schema.GroupResource{Resource: "machines"}, "m", errors.New("x")), false},
		{errors.New("something else"), false},
	} {
		if got := Unreachable(tc.err); got != tc.want {
			t.Errorf("Unreachable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// Waiters share one probe loop, are released by the first successful
// probe, and a cancelled wait returns its context's error.
func TestReachabilityWait(t *testing.T) {
	var up atomic.Bool
	var probes atomic.Int32
	r := newReachability(func(context.Context) error {
		probes.Add(1)
		if up.Load() {
			return nil
		}
		return errors.New("refused")
	}, 10*time.Millisecond, logr.Discard())

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := r.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait while down = %v, want the context's error", err)
	}

	done := make(chan error, 3)
	for range 3 {
		go func() { done <- r.Wait(context.Background()) }()
	}
	time.Sleep(30 * time.Millisecond) // the waiters are blocked, probing
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v while the hub is down", err)
	default:
	}
	before := probes.Load()
	up.Store(true)
	for range 3 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(time.Second):
			t.Fatal("Wait did not return after the hub came back")
		}
	}
	if n := probes.Load() - before; n > 3 {
		t.Errorf("%d probes after the hub came back for 3 waiters: they must share one loop", n)
	}
}
