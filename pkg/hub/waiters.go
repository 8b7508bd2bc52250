package hub

import "sync"

// Waiters lets Create wait for a Machine event instead of polling: the
// Machine informer notifies by NodeClaim name.
type Waiters struct {
	mu sync.Mutex
	m  map[string][]chan struct{}
}

// NewWaiters returns an empty set of waiters.
func NewWaiters() *Waiters { return &Waiters{m: map[string][]chan struct{}{}} }

// Register returns a channel closed at the next notify for name. Register
// before checking state, so that no event between the check and the wait is lost.
func (w *Waiters) Register(name string) <-chan struct{} {
	ch := make(chan struct{})
	w.mu.Lock()
	w.m[name] = append(w.m[name], ch)
	w.mu.Unlock()
	return ch
}

// Notify wakes every waiter for name.
func (w *Waiters) Notify(name string) {
	w.mu.Lock()
	chs := w.m[name]
	delete(w.m, name)
	w.mu.Unlock()
	for _, ch := range chs {
		close(ch)
	}
}

// Forget drops a registration that is no longer waited on.
func (w *Waiters) Forget(name string, ch <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	list := w.m[name]
	for i, c := range list {
		if c == ch {
			w.m[name] = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(w.m[name]) == 0 {
		delete(w.m, name)
	}
}
