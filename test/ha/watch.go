package ha

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// HubWatch records, as they happen, the writes in the hub that tell launches
// and destruction apart: Machines created and deleted, MachineDeployment
// replicas raised and lowered.
type HubWatch struct {
	cancel context.CancelFunc

	mu     sync.Mutex
	events []HubEvent
}

// HubEvent is one observed change.
type HubEvent struct {
	At time.Time
	// MachineCreated, MachineBound (the NodeClaim annotation appeared),
	// MachineDeleting, MachineDeleted, ReplicasRaised, ReplicasLowered,
	// MachineDeploymentDeleted.
	Kind string
	Name string
	// Pool is the object's pool label.
	Pool string
	// From and To are the replicas of a replica change.
	From, To int32
}

func (e HubEvent) String() string {
	if e.Kind == "ReplicasRaised" || e.Kind == "ReplicasLowered" {
		return fmt.Sprintf("%s %s %s %d->%d", e.At.Format("15:04:05.000"), e.Kind, e.Name, e.From, e.To)
	}
	return fmt.Sprintf("%s %s %s", e.At.Format("15:04:05.000"), e.Kind, e.Name)
}

// WatchHub starts watching the world's hub namespace. Stop it when done.
func WatchHub(ctx context.Context, w *world.World) (*HubWatch, error) {
	c, err := cache.New(w.Hub.Config, cache.Options{Scheme: scheme.Scheme, DefaultNamespaces: map[string]cache.Config{w.Namespace: {}}})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	hw := &HubWatch{cancel: cancel}
	mi, err := c.GetInformer(ctx, &clusterv1.Machine{})
	if err != nil {
		cancel()
		return nil, err
	}
	if _, err := mi.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if m, ok := o.(*clusterv1.Machine); ok {
				hw.add("MachineCreated", m.Name, m.Labels[poolLabel], 0, 0)
			}
		},
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*clusterv1.Machine)
			m, ok2 := cur.(*clusterv1.Machine)
			if !ok1 || !ok2 {
				return
			}
			if o.DeletionTimestamp.IsZero() && !m.DeletionTimestamp.IsZero() {
				hw.add("MachineDeleting", m.Name, m.Labels[poolLabel], 0, 0)
			}
			if o.Annotations[v1alpha1.NodeClaimAnnotation] == "" && m.Annotations[v1alpha1.NodeClaimAnnotation] != "" {
				hw.add("MachineBound", m.Name, m.Labels[poolLabel], 0, 0)
			}
		},
		DeleteFunc: func(o any) {
			if tomb, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o = tomb.Obj
			}
			if m, ok := o.(*clusterv1.Machine); ok {
				hw.add("MachineDeleted", m.Name, m.Labels[poolLabel], 0, 0)
			}
		},
	}); err != nil {
		cancel()
		return nil, err
	}
	di, err := c.GetInformer(ctx, &clusterv1.MachineDeployment{})
	if err != nil {
		cancel()
		return nil, err
	}
	if _, err := di.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*clusterv1.MachineDeployment)
			m, ok2 := cur.(*clusterv1.MachineDeployment)
			if !ok1 || !ok2 || o.Spec.Replicas == nil || m.Spec.Replicas == nil {
				return
			}
			switch from, to := *o.Spec.Replicas, *m.Spec.Replicas; {
			case to > from:
				hw.add("ReplicasRaised", m.Name, m.Labels[poolLabel], from, to)
			case to < from:
				hw.add("ReplicasLowered", m.Name, m.Labels[poolLabel], from, to)
			}
		},
		DeleteFunc: func(o any) {
			if tomb, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o = tomb.Obj
			}
			if m, ok := o.(*clusterv1.MachineDeployment); ok {
				hw.add("MachineDeploymentDeleted", m.Name, m.Labels[poolLabel], 0, 0)
			}
		},
	}); err != nil {
		cancel()
		return nil, err
	}
	go func() { _ = c.Start(ctx) }()
	sctx, scancel := context.WithTimeout(ctx, time.Minute)
	defer scancel()
	if !c.WaitForCacheSync(sctx) {
		cancel()
		return nil, fmt.Errorf("the hub watch did not sync")
	}
	// What existed before is no event.
	hw.mu.Lock()
	hw.events = nil
	hw.mu.Unlock()
	return hw, nil
}

func (hw *HubWatch) add(kind, name, pool string, from, to int32) {
	hw.mu.Lock()
	defer hw.mu.Unlock()
	hw.events = append(hw.events, HubEvent{At: time.Now(), Kind: kind, Name: name, Pool: pool, From: from, To: to})
}

// Events returns the events from since on, of the kinds given (all when none).
func (hw *HubWatch) Events(since time.Time, kinds ...string) []HubEvent {
	hw.mu.Lock()
	defer hw.mu.Unlock()
	var out []HubEvent
	for _, e := range hw.events {
		if e.At.Before(since) {
			continue
		}
		if len(kinds) == 0 {
			out = append(out, e)
			continue
		}
		for _, k := range kinds {
			if e.Kind == k {
				out = append(out, e)
				break
			}
		}
	}
	return out
}

// First returns the first event from since on of the kinds in the pool.
func (hw *HubWatch) First(since time.Time, pool string, kinds ...string) (HubEvent, bool) {
	for _, e := range hw.Events(since, kinds...) {
		if pool == "" || e.Pool == pool {
			return e, true
		}
	}
	return HubEvent{}, false
}

// Stop stops watching.
func (hw *HubWatch) Stop() { hw.cancel() }
