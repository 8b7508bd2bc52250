package machinedeployment

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

var hubEnv *environment.Cluster

func TestMain(m *testing.M) {
	var err error
	if hubEnv, err = environment.StartHub(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = hubEnv.Stop()
	os.Exit(code)
}

// countingClient counts the writes that reach the API server.
type countingClient struct {
	client.Client
	updates atomic.Int64
}

func (c *countingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.updates.Add(1)
	return c.Client.Update(ctx, obj, opts...)
}

func newMD(t *testing.T, name string, replicas int32) types.NamespacedName {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "scaler"}}
	_ = hubEnv.Client.Create(context.Background(), ns)
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{Namespace: "scaler", Name: name, ClusterName: "c1", Member: true, Replicas: replicas})
	if err := hubEnv.Client.Create(context.Background(), md); err != nil {
		t.Fatal(err)
	}
	return client.ObjectKeyFromObject(md)
}

func getMD(t *testing.T, key types.NamespacedName) *clusterv1.MachineDeployment {
	t.Helper()
	md := &clusterv1.MachineDeployment{}
	if err := hubEnv.Client.Get(context.Background(), key, md); err != nil {
		t.Fatal(err)
	}
	return md
}

func TestScalerBatchesConcurrentReservationsAndCountsEachOnce(t *testing.T) {
	key := newMD(t, "burst", 0)
	writer := &countingClient{Client: hubEnv.Client}
	s := NewScaler(writer, hubEnv.Client, hubEnv.Client)
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			// Every claim asks twice, as a retried Create would.
			for range 2 {
				errs <- s.Apply(context.Background(), key, &op{kind: opReserve, name: fmt.Sprintf("claim-%d", i), since: time.Now()})
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	md := getMD(t, key)
	if *md.Spec.Replicas != n {
		t.Fatalf("replicas = %d, want %d", *md.Spec.Replicas, n)
	}
	pending, err := hub.PendingNodeClaims(md)
	if err != nil || len(pending) != n {
		t.Fatalf("pending = %d (%v), want %d", len(pending), err, n)
	}
	if w := writer.updates.Load(); w >= n/2 {
		t.Fatalf("%d updates for %d NodeClaims: not batched", w, n)
	}
	t.Logf("%d NodeClaims reserved with %d MachineDeployment updates", n, writer.updates.Load())

	// Give back, bind and release are idempotent too.
	ops := []*op{{kind: opGiveBack, name: "claim-0"}, {kind: opGiveBack, name: "claim-0"}, {kind: opBound, name: "claim-1"}, {kind: opRelease, name: "m-1"}, {kind: opRelease, name: "m-1"}}
	if err := s.Apply(context.Background(), key, ops...); err != nil {
		t.Fatal(err)
	}
	md = getMD(t, key)
	if *md.Spec.Replicas != n-2 {
		t.Fatalf("replicas = %d, want %d (one given back, one released)", *md.Spec.Replicas, n-2)
	}
}

func TestScalerNeverOverwritesAConcurrentWriter(t *testing.T) {
	key := newMD(t, "shared", 5)
	s := NewScaler(hubEnv.Client, hubEnv.Client, hubEnv.Client)
	const n = 30
	var wg sync.WaitGroup
	var writerNet atomic.Int32
	stop := make(chan struct{})
	wg.Add(1)
	go func() { // someone else raising and lowering replicas meanwhile
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			delta := int32(1)
			if i%3 == 2 {
				delta = -1
			}
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				md := getMD(t, key)
				r := *md.Spec.Replicas + delta
				md.Spec.Replicas = &r
				return hubEnv.Client.Update(context.Background(), md)
			})
			if err == nil {
				writerNet.Add(delta)
			}
		}
	}()
	var claims sync.WaitGroup
	for i := 0; i < n; i++ {
		claims.Add(1)
		go func(i int) {
			defer claims.Done()
			if err := s.Apply(context.Background(), key, &op{kind: opReserve, name: fmt.Sprintf("c-%d", i), since: time.Now()}); err != nil {
				t.Error(err)
			}
		}(i)
	}
	claims.Wait()
	close(stop)
	wg.Wait()
	md := getMD(t, key)
	if want := 5 + n + writerNet.Load(); *md.Spec.Replicas != want {
		t.Fatalf("replicas = %d, want 5 + %d reserved + %d by the other writer = %d", *md.Spec.Replicas, n, writerNet.Load(), want)
	}
}
