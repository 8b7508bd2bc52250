package hub

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
)

// Timing of the reachability probe.
const (
	// ProbeInterval is how often an unreachable management cluster is
	// probed while something waits for it.
	ProbeInterval = time.Second
	probeTimeout  = 2 * time.Second
)

// Unreachable reports whether err means an API server did not answer
// (connection refused or reset, a dropped connection, no route to it, a
// failed DNS lookup, a timeout), is overloaded (429) or failed on its side
// (5xx): a transient condition to wait out, never an answer about any
// object.
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	var netErr net.Error
	var dnsErr *net.DNSError
	if utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err) ||
		errors.Is(err, io.ErrUnexpectedEOF) || (errors.As(err, &netErr) && netErr.Timeout()) ||
		errors.As(err, &dnsErr) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
		errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	if apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsServerTimeout(err) ||
		apierrors.IsTimeout(err) || apierrors.IsInternalError(err) {
		return true
	}
	var status apierrors.APIStatus
	return errors.As(err, &status) && status.Status().Code >= 500
}

// RetryAfterOutage is how soon a controller looks again at a key that
// failed because an API server is unreachable: a fixed, short delay instead
// of controller-runtime's per-key exponential backoff (which reaches tens of
// seconds after a dozen failures), so that it resumes within about this
// long of the server's return.
const RetryAfterOutage = ProbeInterval

// OutageResult turns an unreachable-server error into a plain requeue after
// RetryAfterOutage (the error is returned otherwise, backoff applies).
func OutageResult(err error) (time.Duration, error) {
	if Unreachable(err) {
		return RetryAfterOutage, nil
	}
	return 0, err
}

// Reachability tells when an unreachable management cluster answers again,
// probing its API server's /readyz every ProbeInterval while anyone waits.
//
// Why: client-go's reflectors back off exponentially while an API server is
// down (up to 30 s, 60 s with jitter), and Karpenter core retries a failed
// launch after up to a minute. After an outage the provider would then sit
// idle for up to a minute with the hub back. Informers of the hub cache and
// launches instead wait here, and resume within ProbeInterval of the hub's
// return.
type Reachability struct {
	probe    func(context.Context) error
	interval time.Duration
	log      logr.Logger

	mu      sync.Mutex
	back    chan struct{} // closed when a probe succeeds; nil when nobody waits
	waiters int
	since   time.Time // when the current wait began
}

// NewReachability probes the API server of cfg.
func NewReachability(cfg *rest.Config, log logr.Logger) (*Reachability, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = probeTimeout
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return newReachability(func(ctx context.Context) error {
		_, err := dc.RESTClient().Get().AbsPath("/readyz").Do(ctx).Raw()
		if apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
			return nil // it answered; a credential without access to /readyz is no outage
		}
		return err
	}, ProbeInterval, log), nil
}

func newReachability(probe func(context.Context) error, interval time.Duration, log logr.Logger) *Reachability {
	return &Reachability{probe: probe, interval: interval, log: log}
}

// Wait returns once the management cluster answers a probe, or with ctx's
// error.
func (r *Reachability) Wait(ctx context.Context) error {
	r.mu.Lock()
	if r.back == nil {
		r.back = make(chan struct{})
		r.since = time.Now()
		r.log.Info("management cluster unreachable: waiting for it, probing every " + r.interval.String())
		go r.run(r.back)
	}
	back := r.back
	r.waiters++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.waiters--
		r.mu.Unlock()
	}()
	select {
	case <-back:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run probes until the API server answers, or nobody waits any longer. The
// first probe waits an interval too: a caller that fails again right after
// a successful probe (say, a 503 from an API server that reports ready)
// retries at most once per interval.
func (r *Reachability) run(back chan struct{}) {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		<-t.C
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		err := r.probe(ctx)
		cancel()
		r.mu.Lock()
		if err == nil {
			r.log.Info("management cluster reachable again", "after", time.Since(r.since).Round(time.Millisecond).String())
			close(back)
			r.back = nil
			r.mu.Unlock()
			return
		}
		if r.waiters == 0 {
			// Everyone gave up; the next Wait starts probing again.
			r.back = nil
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
	}
}

// newInformer builds the hub cache's informers on list and watch calls that
// wait out an unreachable hub instead of failing into the reflector's
// backoff.
func (r *Reachability) newInformer(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
	inner := toolscache.ToListerWatcherWithContext(lw)
	wrapped := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			for {
				out, err := inner.ListWithContext(ctx, opts)
				if !Unreachable(err) || r.Wait(ctx) != nil {
					return out, err
				}
			}
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			for {
				out, err := inner.WatchWithContext(ctx, opts)
				if !Unreachable(err) || r.Wait(ctx) != nil {
					return out, err
				}
			}
		},
	}
	if l, ok := lw.(*toolscache.ListWatch); ok {
		wrapped.DisableChunking = l.DisableChunking
	}
	return toolscache.NewSharedIndexInformer(wrapped, obj, resync, indexers)
}
