package machinedeployment

import (
	"context"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// goneTTL is how long a live read's NotFound for a NodeClaim is trusted
// when the cache says NotFound too.
const goneTTL = time.Minute

// goneClaims caches, for goneTTL, the NodeClaims a live read found gone.
//
// Why: a NodeClaim is taken as gone only when the cache and a live read
// both say NotFound (an error is never read as gone). Every pass and every
// write asks this for each reservation whose NodeClaim the cache does not
// show, and after core's launch timeout at 1 000 NodeClaims there were
// hundreds: a live read each, on every pass and every write, under the
// MachineDeployment's lock (bench-1000: a successor's reservation waited 4
// minutes behind them). What it caches: the API server's answer NotFound
// for a name, within the last goneTTL. Core names NodeClaims from a
// generated name, so a NodeClaim of the same name made again within a
// minute is not expected; if one were, its reservation would be taken as
// free for that minute, and its own Launch reserves again. After a restart
// the cache is empty: the first question reads live, as before.
type goneClaims struct {
	mu  sync.Mutex
	at  map[string]time.Time
	now func() time.Time
}

// confirmed reports whether a live read found the NodeClaim gone within
// goneTTL.
func (g *goneClaims) confirmed(name string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	t, ok := g.at[name]
	if ok && g.now().Sub(t) >= goneTTL {
		delete(g.at, name)
		return false
	}
	return ok
}

func (g *goneClaims) record(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.at == nil {
		g.at = map[string]time.Time{}
	}
	now := g.now()
	g.at[name] = now
	for k, t := range g.at { // keep it small: forget what has expired
		if now.Sub(t) >= goneTTL {
			delete(g.at, k)
		}
	}
}

// readLive reads a NodeClaim live, remembering a NotFound.
func (g *goneClaims) readLive(ctx context.Context, r client.Reader, name string, nc *karpv1.NodeClaim) error {
	err := r.Get(ctx, types.NamespacedName{Name: name}, nc)
	if apierrors.IsNotFound(err) {
		g.record(name)
	}
	return err
}
