package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/awslabs/operatorpkg/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// A provider that starts while pods are pending and its NodeClass already
// selects MachineDeployments must not, while its caches fill, report the
// NodeClass not Ready or NodeClaims unlaunchable: Karpenter would delete the
// NodeClaims and stall the NodePool.
func TestColdStartKeepsNodeClassReadyAndNodeClaims(t *testing.T) {
	provider.Kill()
	t.Cleanup(func() {
		if provider.Exited() {
			p, err := StartProvider(bin, w, "provider.log")
			if err != nil {
				t.Fatal(err)
			}
			provider = p
		}
	})
	pool(t, "cold")
	md := machineDeployment(t, "cold", "cold-m5-large", "m5.large", "us-east-1b", map[string]string{v1alpha1.PriceAnnotation: "0.096"})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	spokeCache, err := cache.New(w.Spoke.Config, cache.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var notReady []string
	deleted := map[string]bool{}
	nci, err := spokeCache.GetInformer(ctx, &v1alpha1.ClusterAPINodeClass{})
	if err != nil {
		t.Fatal(err)
	}
	onNodeClass := func(o any) {
		nc, ok := o.(*v1alpha1.ClusterAPINodeClass)
		if !ok || nc.Name != "cold" {
			return
		}
		if c := nc.StatusConditions().Get(status.ConditionReady); c != nil && c.Status == metav1.ConditionFalse {
			mu.Lock()
			notReady = append(notReady, c.Reason+": "+c.Message)
			mu.Unlock()
		}
	}
	if _, err := nci.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: onNodeClass, UpdateFunc: func(_, n any) { onNodeClass(n) }}); err != nil {
		t.Fatal(err)
	}
	ni, err := spokeCache.GetInformer(ctx, &karpv1.NodeClaim{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ni.AddEventHandler(toolscache.ResourceEventHandlerFuncs{DeleteFunc: func(o any) {
		if tomb, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
			o = tomb.Obj
		}
		if nc, ok := o.(*karpv1.NodeClaim); ok && nc.Labels[karpv1.NodePoolLabelKey] == "cold" {
			mu.Lock()
			deleted[nc.Name] = true
			mu.Unlock()
		}
	}}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = spokeCache.Start(ctx) }()
	spokeCache.WaitForCacheSync(ctx)

	// First run: let the NodeClass become Ready, then stop the provider.
	provider, err = StartProvider(bin, w, "provider.log")
	if err != nil {
		t.Fatal(err)
	}
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		nc := &v1alpha1.ClusterAPINodeClass{}
		if err := w.Spoke.Client.Get(ctx, clientKey("cold"), nc); err != nil {
			return false, err
		}
		return nc.StatusConditions().Get(status.ConditionReady).IsTrue(), nil
	}); err != nil {
		t.Fatalf("NodeClass cold never Ready: %v", err)
	}
	provider.Kill()
	mu.Lock()
	notReady = nil // only what happens across the restart counts
	mu.Unlock()

	// Pods arrive while the provider is down; it starts cold.
	deployment(t, "cold", "app-cold", 2, "1500m")
	provider, err = StartProvider(bin, w, "provider.log")
	if err != nil {
		t.Fatal(err)
	}
	got := waitCounts(t, 4*time.Minute, "cold", "app-cold", []*clusterv1.MachineDeployment{md}, func(c counts) bool { return c.RunningPods == 2 })
	mu.Lock()
	defer mu.Unlock()
	if len(notReady) > 0 {
		t.Fatalf("the NodeClass turned not Ready while the provider started: %v", notReady)
	}
	if len(deleted) > 0 || got.NodeClaims != 2 {
		t.Fatalf("NodeClaims deleted while the provider started: %v (now %s)", deleted, got)
	}
}
