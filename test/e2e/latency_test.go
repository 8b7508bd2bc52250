package e2e

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	toolscache "k8s.io/client-go/tools/cache"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// BenchmarkLaunchLatency measures what the provider adds to a launch: from
// the moment the instance gets its providerID (the AWSMachine's, seen by a
// watch on the hub; a launch returns on it, before Cluster API copies it
// onto the Machine) to the moment its NodeClaim carries it (seen by a watch on the spoke), which
// includes Create returning and core writing the NodeClaim status.
// Run: go test -run '^$' -bench LaunchLatency ./test/e2e/
func BenchmarkLaunchLatency(b *testing.B) {
	const nodes = 20
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var mu sync.Mutex
	machineSeen := map[string]time.Time{} // providerID -> first seen
	claimSeen := map[string]time.Time{}

	hubCache, spokeCache := worldCaches(b)
	mi, err := hubCache.GetInformer(ctx, &infrav1.AWSMachine{})
	if err != nil {
		b.Fatal(err)
	}
	ni, err := spokeCache.GetInformer(ctx, &karpv1.NodeClaim{})
	if err != nil {
		b.Fatal(err)
	}
	onMachine := func(o any) {
		m, ok := o.(*infrav1.AWSMachine)
		if !ok || m.Spec.ProviderID == nil || *m.Spec.ProviderID == "" {
			return
		}
		mu.Lock()
		if _, ok := machineSeen[*m.Spec.ProviderID]; !ok {
			machineSeen[*m.Spec.ProviderID] = time.Now()
		}
		mu.Unlock()
	}
	onClaim := func(o any) {
		nc, ok := o.(*karpv1.NodeClaim)
		if !ok || nc.Status.ProviderID == "" {
			return
		}
		mu.Lock()
		if _, ok := claimSeen[nc.Status.ProviderID]; !ok {
			claimSeen[nc.Status.ProviderID] = time.Now()
		}
		mu.Unlock()
	}
	if _, err := mi.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: onMachine, UpdateFunc: func(_, n any) { onMachine(n) }}); err != nil {
		b.Fatal(err)
	}
	if _, err := ni.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: onClaim, UpdateFunc: func(_, n any) { onClaim(n) }}); err != nil {
		b.Fatal(err)
	}
	go func() { _ = hubCache.Start(ctx) }()
	go func() { _ = spokeCache.Start(ctx) }()
	hubCache.WaitForCacheSync(ctx)
	spokeCache.WaitForCacheSync(ctx)

	pool(b, "latency")
	md := machineDeployment(b, "latency", "latency-m5-large", "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	d := deployment(b, "latency", "app-latency", nodes, "1500m")
	waitCounts(b, 5*time.Minute, "latency", "app-latency", []*clusterv1.MachineDeployment{md}, func(c counts) bool { return c.Initialized == nodes })

	var lat []time.Duration
	mu.Lock()
	for id, seen := range machineSeen {
		if c, ok := claimSeen[id]; ok {
			lat = append(lat, c.Sub(seen))
		}
	}
	mu.Unlock()
	scaleDeployment(b, d, 0)
	if len(lat) == 0 {
		b.Fatal("no launches measured")
	}
	buckets, n, err := provider.Histogram("karpenter_clusterapi_launch_return_delay_seconds")
	if err != nil || n == 0 {
		b.Fatalf("reading the provider's launch_return_delay_seconds: %v (count %v)", err, n)
	}
	b.ReportMetric(Quantile(buckets, n, 0.5)*1000, "provider-p50-ms<=")
	b.ReportMetric(Quantile(buckets, n, 0.99)*1000, "provider-p99-ms<=")
	fmt.Printf("provider-added (infrastructure machine event -> Create returns) over %.0f launches: p50 <= %gms, p99 <= %gms\n",
		n, Quantile(buckets, n, 0.5)*1000, Quantile(buckets, n, 0.99)*1000)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p := func(q float64) time.Duration { return lat[min(len(lat)-1, int(q*float64(len(lat))))] }
	b.ReportMetric(float64(p(0.5).Milliseconds()), "end-to-end-p50-ms")
	b.ReportMetric(float64(p(0.99).Milliseconds()), "end-to-end-p99-ms")
	fmt.Printf("end to end (AWSMachine providerID seen on the hub -> NodeClaim providerID seen on the spoke, incl. core's status write) over %d launches: p50 %s, p99 %s, max %s\n",
		len(lat), p(0.5), p(0.99), lat[len(lat)-1])
}
