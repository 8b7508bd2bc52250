package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/launch"
)

// fallbackTimeline polls the Machines of the given MachineDeployments (every
// 200 ms, so each figure is good to about that) and records when each was
// first seen, bound, reported failed by its infrastructure machine and
// marked for deletion, relative to start. It is where a fallback's time
// goes, round by round; stop ends it and returns the report.
func fallbackTimeline(start time.Time, mds ...*clusterv1.MachineDeployment) (stop func() string) {
	type stages struct {
		md                            string
		seen, bound, failed, released time.Duration
	}
	var mu sync.Mutex
	machines := map[string]*stages{}
	stopPoll := poll(200*time.Millisecond, func(ctx context.Context) {
		for _, md := range mds {
			list := &clusterv1.MachineList{}
			if err := w.Hub.Client.List(ctx, list, client.InNamespace(md.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
				continue
			}
			at := time.Since(start)
			mu.Lock()
			for i := range list.Items {
				m := &list.Items[i]
				s := machines[m.Name]
				if s == nil {
					s = &stages{md: md.Name, seen: at}
					machines[m.Name] = s
				}
				if s.bound == 0 && m.Annotations[v1alpha1.NodeClaimAnnotation] != "" {
					s.bound = at
				}
				if _, ok := m.Annotations[clusterv1.DeleteMachineAnnotation]; ok && s.released == 0 {
					s.released = at
				}
				if s.failed == 0 {
					infra := &unstructured.Unstructured{}
					infra.SetGroupVersionKind(infrav1.GroupVersion.WithKind(m.Spec.InfrastructureRef.Kind))
					if m.Spec.InfrastructureRef.Name != "" &&
						w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.InfrastructureRef.Name}, infra) == nil &&
						launch.ReadLaunchFailure(infra).Failed {
						s.failed = at
					}
				}
			}
			mu.Unlock()
		}
	})
	return func() string {
		stopPoll()
		mu.Lock()
		defer mu.Unlock()
		list := make([]*stages, 0, len(machines))
		names := map[*stages]string{}
		for name, s := range machines {
			list = append(list, s)
			names[s] = name
		}
		sort.Slice(list, func(i, j int) bool { return list[i].seen < list[j].seen })
		f := func(d time.Duration) string {
			if d == 0 {
				return "-"
			}
			return fmt.Sprintf("%.1fs", d.Seconds())
		}
		var b strings.Builder
		for _, s := range list {
			fmt.Fprintf(&b, "\n  %-22s %-14s made %-6s bound %-6s failed %-6s released %s", names[s], s.md, f(s.seen), f(s.bound), f(s.failed), f(s.released))
		}
		return b.String()
	}
}

// poll calls f every interval, at once first, until stop is called; stop
// waits for the call in progress.
func poll(interval time.Duration, f func(ctx context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			f(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}
