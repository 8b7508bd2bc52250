// Package signal turns a coalesced change signal (instancetype.Store's
// Subscribe) into a controller-runtime event source.
package signal

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

// Events forwards each signal from changes as a GenericEvent for obj until
// ctx ends. At most one event waits: one queued reconcile covers every
// change before it.
func Events(ctx context.Context, changes <-chan struct{}, obj client.Object) <-chan event.GenericEvent {
	events := make(chan event.GenericEvent, 1)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-changes:
				select {
				case events <- event.GenericEvent{Object: obj}:
				default:
				}
			}
		}
	}()
	return events
}
