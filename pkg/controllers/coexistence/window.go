package coexistence

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/operator/options"
)

// DefaultWindow is how long after another autoscaler last changed a
// member MachineDeployment's spec.replicas SoleScaler stays False
// (--sole-scaler-window). Longer than cluster-autoscaler's default
// scale-down-unneeded-time (10m), so one still running but idle between
// scale-downs is not taken for gone.
const DefaultWindow = 15 * time.Minute

// window is the configured window, from the provider's options.
func window(ctx context.Context) time.Duration {
	if o := options.FromContext(ctx); o != nil && o.SoleScalerWindow > 0 {
		return o.SoleScalerWindow
	}
	return DefaultWindow
}

// sighting is the last time another autoscaler was seen changing a
// MachineDeployment's replicas, and who.
type sighting struct {
	at      time.Time
	writers []Writer
}

// sightings remembers, per MachineDeployment, the last change by another
// autoscaler this process saw (its watch), or, for one that owned the
// field before the process started, when it was first found owning it
// (its time when the API server recorded one): memory only sharpens what
// the objects say, and a restart at worst restarts the window.
type sightings struct {
	mu sync.Mutex
	m  map[types.NamespacedName]sighting
}

// saw records a change by writers at t.
func (s *sightings) saw(key types.NamespacedName, t time.Time, writers []Writer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[types.NamespacedName]sighting{}
	}
	s.m[key] = sighting{at: t, writers: writers}
}

// last is the latest sighting for md at now: the remembered one, or the
// field's owner if it is another autoscaler (the first time found, or the
// time the API server recorded).
func (s *sightings) last(md *clusterv1.MachineDeployment, now time.Time) (sighting, bool) {
	key := types.NamespacedName{Namespace: md.Namespace, Name: md.Name}
	s.mu.Lock()
	defer s.mu.Unlock()
	seen, ok := s.m[key]
	var owners []Writer
	for _, w := range ReplicaWriters(md) {
		if w.Autoscaler() {
			owners = append(owners, w)
		}
	}
	if len(owners) == 0 {
		return seen, ok
	}
	at := now
	if ok {
		at = seen.at
	}
	for _, w := range owners {
		if w.Time != nil && w.Time.After(at) {
			at = w.Time.Time
		}
	}
	if !ok || at.After(seen.at) {
		seen = sighting{at: at, writers: owners}
		if s.m == nil {
			s.m = map[types.NamespacedName]sighting{}
		}
		s.m[key] = seen
	}
	return seen, true
}

// verdict judges one member MachineDeployment: scaled by another autoscaler
// within the window (a message saying what to do given its annotations now,
// and when to look again), or not.
func verdict(md *clusterv1.MachineDeployment, seen sighting, found bool, now time.Time, win time.Duration) (string, time.Duration) {
	if !found {
		return "", 0
	}
	left := seen.at.Add(win).Sub(now)
	if left <= 0 {
		return "", 0
	}
	_, hasMin := md.Annotations[clusterv1.AutoscalerMinSizeAnnotation]
	_, hasMax := md.Annotations[clusterv1.AutoscalerMaxSizeAnnotation]
	advice := "it has no min-size annotation, so cluster-autoscaler no longer takes it for a node group by its annotations: " +
		"if it is still being scaled, stop that writer (cluster-autoscaler discovering it by label, kubectl scale, a HorizontalPodAutoscaler)"
	if hasMin && hasMax {
		advice = "it has both size annotations, so cluster-autoscaler scales it: remove its min-size annotation " +
			"(kubectl annotate machinedeployment " + md.Name + " " + clusterv1.AutoscalerMinSizeAnnotation + "-) or narrow cluster-autoscaler's --node-group-auto-discovery"
	}
	return fmt.Sprintf("MachineDeployment %s/%s: spec.replicas changed by %s, last seen %s ago; %s; True once no other autoscaler has changed them for %s",
		md.Namespace, md.Name, describe(seen.writers), now.Sub(seen.at).Round(time.Second), advice, win), left
}
