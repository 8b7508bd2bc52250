package launch

import (
	"sort"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
)

// Unavailable remembers offerings (instance type, zone, capacity type) that
// failed for lack of capacity, for a TTL, so that Karpenter launches on the
// next offering instead of retrying the exhausted one.
type Unavailable struct {
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	until   map[instancetype.OfferingKey]time.Time
	reasons map[instancetype.OfferingKey]string
	version int64
	// onChange is called (outside the lock) when the set changes.
	onChange func()
}

// NewUnavailable returns an empty set whose entries last ttl.
func NewUnavailable(ttl time.Duration, onChange func()) *Unavailable {
	return &Unavailable{
		ttl: ttl, now: time.Now, onChange: onChange,
		until:   map[instancetype.OfferingKey]time.Time{},
		reasons: map[instancetype.OfferingKey]string{},
	}
}

// Mark makes the offering unavailable for the TTL from now.
func (u *Unavailable) Mark(key instancetype.OfferingKey, reason string) {
	u.mu.Lock()
	u.until[key] = u.now().Add(u.ttl)
	u.reasons[key] = reason
	u.version++
	u.mu.Unlock()
	metrics.UnavailableOfferings.WithLabelValues(key.InstanceType, key.Zone, key.CapacityType).Set(1)
	if u.onChange != nil {
		u.onChange()
	}
	if u.ttl > 0 {
		// Tell listeners when it expires, so status and schedulers see it back.
		time.AfterFunc(u.ttl+10*time.Millisecond, func() { u.Version() })
	}
}

// TTL is how long an offering stays unavailable.
func (u *Unavailable) TTL() time.Duration { return u.ttl }

// SetClock replaces the clock (tests).
func (u *Unavailable) SetClock(now func() time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.now = now
}

// Has reports whether the offering is unavailable now.
func (u *Unavailable) Has(key instancetype.OfferingKey) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	t, ok := u.until[key]
	return ok && u.now().Before(t)
}

// Version changes whenever the set changes, expiries included: callers use
// it to tell whether what they computed from the set is still current.
func (u *Unavailable) Version() int64 {
	u.mu.Lock()
	now := u.now()
	var expired []instancetype.OfferingKey
	for k, t := range u.until {
		if !now.Before(t) {
			expired = append(expired, k)
			delete(u.until, k)
			delete(u.reasons, k)
		}
	}
	if len(expired) > 0 {
		u.version++
	}
	v := u.version
	u.mu.Unlock()
	for _, k := range expired {
		metrics.UnavailableOfferings.DeleteLabelValues(k.InstanceType, k.Zone, k.CapacityType)
	}
	if len(expired) > 0 && u.onChange != nil {
		u.onChange()
	}
	return v
}

// Entry is one unavailable offering.
type Entry struct {
	instancetype.OfferingKey
	Until  time.Time
	Reason string
}

// List returns the unavailable offerings, sorted.
func (u *Unavailable) List() []Entry {
	u.Version() // drop the expired
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]Entry, 0, len(u.until))
	for k, t := range u.until {
		out = append(out, Entry{OfferingKey: k, Until: t, Reason: u.reasons[k]})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].OfferingKey, out[j].OfferingKey
		if a.InstanceType != b.InstanceType {
			return a.InstanceType < b.InstanceType
		}
		if a.Zone != b.Zone {
			return a.Zone < b.Zone
		}
		return a.CapacityType < b.CapacityType
	})
	return out
}

// For returns the unavailable offerings of the instance types named, for a
// NodeClass's status; reasons are cut to a readable length.
func (u *Unavailable) For(instanceTypes map[string]bool) []v1alpha1.UnavailableOffering {
	var out []v1alpha1.UnavailableOffering
	for _, e := range u.List() {
		if !instanceTypes[e.InstanceType] {
			continue
		}
		reason := e.Reason
		if len(reason) > 256 {
			reason = reason[:253] + "..."
		}
		out = append(out, v1alpha1.UnavailableOffering{
			InstanceType: e.InstanceType, Zone: e.Zone, CapacityType: e.CapacityType,
			Until: metav1.NewTime(e.Until.Truncate(time.Second)), Reason: reason,
		})
	}
	return out
}
