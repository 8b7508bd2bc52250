package world

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
)

// reconnectInterval is how often the world's informers retry an API server
// that refuses connections.
const reconnectInterval = 250 * time.Millisecond

// reconnectingInformer is the world's controllers' informer constructor
// (cache.Options.NewInformer): list and watch calls that find the API server
// down retry every reconnectInterval instead of failing into client-go's
// reflector backoff, which grows to 30 s (60 s with jitter) during an outage.
// After StartHubAPIServer, Cluster API, SimAWS and the bootstrap provider
// then resume at once, and an outage test measures the provider under test,
// not client-go's backoff inside the world. Nothing changes while the API
// server is up.
func reconnectingInformer(lw toolscache.ListerWatcher, obj runtime.Object, resync time.Duration, indexers toolscache.Indexers) toolscache.SharedIndexInformer {
	inner := toolscache.ToListerWatcherWithContext(lw)
	down := func(ctx context.Context, err error) bool {
		if !utilnet.IsConnectionRefused(err) && !apierrors.IsServiceUnavailable(err) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(reconnectInterval):
			return true
		}
	}
	wrapped := &toolscache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			for {
				out, err := inner.ListWithContext(ctx, opts)
				if !down(ctx, err) {
					return out, err
				}
			}
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			for {
				out, err := inner.WatchWithContext(ctx, opts)
				if !down(ctx, err) {
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
