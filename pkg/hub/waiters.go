package machinedeployment

import "sync"

// waiters lets Create wait for a Machine event instead of polling: the
// Machine informer notifies by NodeClaim name.
type waiters struct {
	mu sync.Mutex
	m  map[string][]chan struct{}
}

func newWaiters() *waiters { return &waiters{m: map[string][]chan struct{}{}} }

// register returns a channel closed at the next notify for name. Register
// before checking state, so that no event between the check and the wait is lost.
func (w *waiters) register(name string) <-chan struct{} {
	ch := make(chan struct{})
	w.mu.Lock()
	w.m[name] = append(w.m[name], ch)
	w.mu.Unlock()
	return ch
}

// notify wakes every waiter for name.
func (w *waiters) notify(name string) {
	w.mu.Lock()
	chs := w.m[name]
	delete(w.m, name)
	w.mu.Unlock()
	for _, ch := range chs {
		close(ch)
	}
}

// forget drops a registration that is no longer waited on.
func (w *waiters) forget(name string, ch <-chan struct{}) {
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
