// Package bench measures the provider's hot paths against real API servers
// and informer caches: go test -bench . ./test/bench/ (make bench).
package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes/scheme"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/cloudprovider"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/launch"
	"github.com/autonode/karpenter-clusterapi/pkg/machine"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

const (
	namespace          = "bench"
	clusterName        = "c1"
	machineCount       = 10000
	machineDeployments = 500
	// templates of the Machine-mode NodeClass: each offered in 3 zones,
	// on-demand and spot.
	templates = 100
)

var (
	cp          *cloudprovider.CloudProvider
	store       *instancetype.Store
	nodePool    *karpv1.NodePool
	nodePoolMM  *karpv1.NodePool
	mdList      []*clusterv1.MachineDeployment
	unavailable *launch.Unavailable
)

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Exit(m.Run()) // nothing to set up without benchmarks
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrl.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hubEnv, err := environment.StartHub()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer hubEnv.Stop()
	spokeEnv, err := environment.StartSpoke()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer spokeEnv.Stop()
	start := time.Now()
	if err := populate(ctx, hubEnv.Client, spokeEnv.Client); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "created %d Machines and %d MachineDeployments in %s\n", machineCount, machineDeployments, time.Since(start).Round(time.Second))

	h, err := hub.New(hubEnv.Config, scheme.Scheme, hub.Scope{Namespace: namespace, ClusterName: clusterName})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := h.SetupIndexes(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	spoke, err := cluster.New(spokeEnv.Config, func(o *cluster.Options) { o.Scheme = scheme.Scheme })
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	managed, err := h.NewManagedMachines(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go func() { _ = h.Start(ctx) }()
	go func() { _ = spoke.Start(ctx) }()
	// Touch the informers the benchmarks use, then wait for them to sync.
	_ = h.GetCache().List(ctx, &clusterv1.MachineList{}, client.InNamespace(namespace))
	_ = spoke.GetCache().Get(ctx, client.ObjectKey{Name: "bench"}, &v1alpha1.ClusterAPINodeClass{})
	if !h.GetCache().WaitForCacheSync(ctx) || !spoke.GetCache().WaitForCacheSync(ctx) {
		fmt.Fprintln(os.Stderr, "caches did not sync")
		return 1
	}
	store = instancetype.NewStore()
	for _, md := range mdList {
		store.Put(instancetype.FromMachineDeployment(md, nil))
	}
	if err := waitFor(func() bool { return managed.Len() == machineCount }); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	unavailable = launch.NewUnavailable(time.Hour, nil)
	catalogue, err := machine.NewCatalogue(ctx, h, unavailable, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	lookup := hub.NewLookup(h, managed)
	mm, err := machine.NewProvider(ctx, h, lookup, catalogue)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cp = cloudprovider.New(spoke.GetClient(), managed, lookup, machinedeployment.NewProvider(h, managed, store, unavailable).Mode(), mm.Mode())
	nodePool = &karpv1.NodePool{Spec: karpv1.NodePoolSpec{Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{
		NodeClassRef: &karpv1.NodeClassReference{Group: v1alpha1.Group, Kind: "ClusterAPINodeClass", Name: "bench"},
	}}}}
	nodePoolMM = &karpv1.NodePool{Spec: karpv1.NodePoolSpec{Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{
		NodeClassRef: &karpv1.NodeClassReference{Group: v1alpha1.Group, Kind: "ClusterAPINodeClass", Name: "bench-mm"},
	}}}}
	return m.Run()
}

func populate(ctx context.Context, hubClient, spokeClient client.Client) error {
	if err := hubClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		return err
	}
	if err := spokeClient.Create(ctx, &v1alpha1.ClusterAPINodeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "bench"},
		Spec:       v1alpha1.ClusterAPINodeClassSpec{ScalableResourceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "bench"}}},
	}); err != nil {
		return err
	}
	if err := populateTemplates(ctx, hubClient, spokeClient); err != nil {
		return err
	}
	for i := 0; i < machineDeployments; i++ {
		md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
			Namespace: namespace, Name: fmt.Sprintf("md-%03d", i), ClusterName: clusterName, Member: true,
			Labels:        map[string]string{"pool": "bench"},
			FailureDomain: []string{"us-east-1a", "us-east-1b", "us-east-1c"}[i%3],
			Annotations: map[string]string{
				"capacity.cluster-autoscaler.kubernetes.io/cpu":    fmt.Sprint(2 << (i % 5)),
				"capacity.cluster-autoscaler.kubernetes.io/memory": fmt.Sprintf("%dGi", 8<<(i%5)),
				"capacity.cluster-autoscaler.kubernetes.io/labels": fmt.Sprintf("node.kubernetes.io/instance-type=type-%d", i/3),
				v1alpha1.PriceAnnotation:                           fmt.Sprintf("0.%03d", 50+i),
			},
		})
		mdList = append(mdList, md)
	}
	jobs := make(chan int)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				var obj client.Object
				if i < machineDeployments {
					obj = mdList[i].DeepCopy()
				} else {
					n := i - machineDeployments
					obj = &clusterv1.Machine{
						ObjectMeta: metav1.ObjectMeta{
							Namespace: namespace, Name: fmt.Sprintf("m-%05d", n),
							Labels: map[string]string{
								clusterv1.ClusterNameLabel:           clusterName,
								clusterv1.MachineDeploymentNameLabel: fmt.Sprintf("md-%03d", n%machineDeployments),
								v1alpha1.KarpenterMemberLabel:        "",
							},
							Annotations: map[string]string{v1alpha1.NodeClaimAnnotation: fmt.Sprintf("nc-%05d", n)},
						},
						Spec: clusterv1.MachineSpec{
							ClusterName:       clusterName,
							ProviderID:        providerID(n),
							Bootstrap:         clusterv1.Bootstrap{DataSecretName: new(string)},
							InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "AWSMachine", Name: fmt.Sprintf("m-%05d", n)},
						},
					}
				}
				if err := hubClient.Create(ctx, obj); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := 0; i < machineDeployments+machineCount; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// populateTemplates creates the Cluster with three failure domains, the
// Machine-mode NodeClass and its member AWSMachineTemplates.
func populateTemplates(ctx context.Context, hubClient, spokeClient client.Client) error {
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: clusterName},
		Spec: clusterv1.ClusterSpec{
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "AWSCluster", Name: clusterName},
		},
	}
	if err := hubClient.Create(ctx, cluster); err != nil {
		return err
	}
	for _, z := range []string{"us-east-1a", "us-east-1b", "us-east-1c"} {
		cluster.Status.FailureDomains = append(cluster.Status.FailureDomains, clusterv1.FailureDomain{Name: z})
	}
	if err := hubClient.Status().Update(ctx, cluster); err != nil {
		return err
	}
	secret := "bootstrap"
	if err := spokeClient.Create(ctx, &v1alpha1.ClusterAPINodeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-mm"},
		Spec: v1alpha1.ClusterAPINodeClassSpec{MachineTemplate: &v1alpha1.MachineTemplate{
			InfrastructureTemplates: v1alpha1.InfrastructureTemplates{
				APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "AWSMachineTemplate",
				Selector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": "bench-mm"}},
			},
			Bootstrap: v1alpha1.Bootstrap{DataSecretName: &secret},
		}},
	}); err != nil {
		return err
	}
	for i := 0; i < templates; i++ {
		t := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "AWSMachineTemplate",
			"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"instanceType": fmt.Sprintf("type-%03d", i)}}},
		}}
		t.SetNamespace(namespace)
		t.SetName(fmt.Sprintf("tmpl-%03d", i))
		t.SetLabels(map[string]string{v1alpha1.KarpenterMemberLabel: "", "pool": "bench-mm", clusterv1.ClusterNameLabel: clusterName})
		t.SetAnnotations(map[string]string{
			"capacity.cluster-autoscaler.kubernetes.io/cpu":    fmt.Sprint(2 << (i % 5)),
			"capacity.cluster-autoscaler.kubernetes.io/memory": fmt.Sprintf("%dGi", 8<<(i%5)),
			v1alpha1.PriceAnnotation:                           fmt.Sprintf("0.%03d", 50+i),
			v1alpha1.SpotPriceAnnotation:                       fmt.Sprintf("0.%03d", 20+i),
		})
		if err := hubClient.Create(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

func waitFor(cond func() bool) error {
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

func providerID(n int) string { return fmt.Sprintf("aws:///us-east-1a/i-%017x", n) }

// BenchmarkGet: Get(providerID) with 10,000 Machines in the hub.
func BenchmarkGet(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		nc, err := cp.Get(ctx, providerID(i%machineCount))
		if err != nil || nc.Status.ProviderID == "" {
			b.Fatalf("Get: %v", err)
		}
	}
}

// BenchmarkList: List with 10,000 Machines in the hub.
func BenchmarkList(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		ncs, err := cp.List(ctx)
		if err != nil || len(ncs) != machineCount {
			b.Fatalf("List: %d, %v", len(ncs), err)
		}
	}
}

// BenchmarkGetInstanceTypes: 500 MachineDeployments, nothing changed since
// the last call (the common case: every scheduling pass asks).
func BenchmarkGetInstanceTypes(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		its, err := cp.GetInstanceTypes(ctx, nodePool)
		if err != nil || len(its) == 0 {
			b.Fatalf("GetInstanceTypes: %d, %v", len(its), err)
		}
	}
}

// BenchmarkGetInstanceTypesAfterChange: 500 MachineDeployments, one of which
// changed before every call (the worst case: a full rebuild).
func BenchmarkGetInstanceTypesAfterChange(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		src := instancetype.FromMachineDeployment(mdList[i%len(mdList)], nil)
		src.Replicas = int32(i) // a replica change
		store.Put(src)
		if its, err := cp.GetInstanceTypes(ctx, nodePool); err != nil || len(its) == 0 {
			b.Fatalf("GetInstanceTypes: %d, %v", len(its), err)
		}
	}
}

// BenchmarkGetInstanceTypesMachineMode: a Machine-mode NodeClass over 100
// templates (600 offerings), nothing changed since the last call.
func BenchmarkGetInstanceTypesMachineMode(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		its, err := cp.GetInstanceTypes(ctx, nodePoolMM)
		if err != nil || len(its) != templates {
			b.Fatalf("GetInstanceTypes: %d, %v", len(its), err)
		}
	}
}

// BenchmarkGetInstanceTypesMachineModeAfterChange: the same, with an
// offering marked unavailable before every call (a full rebuild).
func BenchmarkGetInstanceTypesMachineModeAfterChange(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		unavailable.Mark(instancetype.OfferingKey{InstanceType: fmt.Sprintf("type-%03d", i%templates), Zone: "us-east-1a", CapacityType: "spot"}, "bench")
		if its, err := cp.GetInstanceTypes(ctx, nodePoolMM); err != nil || len(its) != templates {
			b.Fatalf("GetInstanceTypes: %d, %v", len(its), err)
		}
	}
}
