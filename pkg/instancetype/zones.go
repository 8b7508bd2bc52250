package instancetype

import (
	"sort"
	"sync"
	"sync/atomic"
)

// Zones are the zones the infrastructure is known to put instances in: the
// zones nodes of this provider registered in. An offering in no particular
// zone (a MachineDeployment without a failure domain, a template in a
// Cluster without failure domains) launches wherever the infrastructure puts
// it; once its node is up, Karpenter core looks the node's offering up by
// the node's zone (its drift check, an hour after launch, finds "no
// compatible offering" and replaces the node; consolidation and cost
// tracking price it at 0). Build gives such an instance type a price record
// for every zone known here: an offering in that zone, at the zoneless
// offering's price, not available, so core finds the node's offering
// without ever launching one there.
type Zones struct {
	mu       sync.RWMutex
	set      map[string]struct{}
	version  atomic.Int64
	onChange []func()
}

// NewZones returns an empty set.
func NewZones() *Zones { return &Zones{set: map[string]struct{}{}} }

// Note records a zone; it reports whether the zone was new (and then calls
// the OnChange functions).
func (z *Zones) Note(zone string) bool {
	if z == nil || zone == "" {
		return false
	}
	// Every Node event notes its zone: the known ones take a read lock only.
	z.mu.RLock()
	_, known := z.set[zone]
	z.mu.RUnlock()
	if known {
		return false
	}
	z.mu.Lock()
	if _, ok := z.set[zone]; ok {
		z.mu.Unlock()
		return false
	}
	z.set[zone] = struct{}{}
	z.version.Add(1)
	calls := append([]func(){}, z.onChange...)
	z.mu.Unlock()
	for _, f := range calls {
		f()
	}
	return true
}

// List returns the zones, sorted (nil for a nil set).
func (z *Zones) List() []string {
	if z == nil {
		return nil
	}
	z.mu.RLock()
	defer z.mu.RUnlock()
	out := make([]string, 0, len(z.set))
	for k := range z.set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Version changes with every new zone (0 for a nil set).
func (z *Zones) Version() int64 {
	if z == nil {
		return 0
	}
	return z.version.Load()
}

// OnChange calls f after each new zone.
func (z *Zones) OnChange(f func()) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.onChange = append(z.onChange, f)
}
