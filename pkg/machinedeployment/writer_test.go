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
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
	writes atomic.Int64
}

func (c *countingClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	c.writes.Add(1)
	return c.Client.Patch(ctx, obj, patch, opts...)
}

func (c *countingClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	c.writes.Add(1)
	return c.Client.Update(ctx, obj, opts...)
}

func newMD(t *testing.T, name string, replicas int32) types.NamespacedName {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "writer"}}
	_ = hubEnv.Client.Create(context.Background(), ns)
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{Namespace: "writer", Name: name, ClusterName: "c1", Member: true, Replicas: replicas})
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

func newWriter(c client.Client) *writer {
	return &writer{client: c, cache: hubEnv.Client, live: hubEnv.Client, locks: &mdLocks{},
		free:    func(context.Context, string) bool { return false },
		written: func(client.Object) {}, queues: map[types.NamespacedName]*writeQueue{}}
}

// A burst of NodeClaims on one MachineDeployment costs a few writes, and
// each NodeClaim, asking twice as a retried Create does, is raised once.
func TestWriterBatchesConcurrentReservationsAndCountsEachOnce(t *testing.T) {
	key := newMD(t, "burst", 0)
	c := &countingClient{Client: hubEnv.Client}
	w := newWriter(c)
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for range 2 {
				errs <- w.do(context.Background(), key, &intent{kind: intentReserve, claim: fmt.Sprintf("claim-%d", i)})
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
	if *md.Spec.Replicas != n || md.Annotations[OwnedReplicasAnnotation] != fmt.Sprint(n) {
		t.Fatalf("replicas %d, owned %s: want %d each", *md.Spec.Replicas, md.Annotations[OwnedReplicasAnnotation], n)
	}
	pending, err := hub.PendingNodeClaims(md)
	if err != nil || len(pending) != n {
		t.Fatalf("pending = %d (%v), want %d", len(pending), err, n)
	}
	if got := c.writes.Load(); got >= n/2 {
		t.Fatalf("%d writes for %d NodeClaims: not batched", got, n)
	}
	t.Logf("%d NodeClaims reserved with %d MachineDeployment writes", n, c.writes.Load())
}

// A raise is stamped with the API server's clock: the time the API server
// put on the provider's managed-fields entry at the raise, written into the
// reservation by the next write.
func TestRaiseStampIsTheAPIServersTimeOfTheRaise(t *testing.T) {
	key := newMD(t, "stamp", 0)
	w := newWriter(hubEnv.Client)
	before := time.Now().Add(-2 * time.Second)
	if err := w.do(context.Background(), key, &intent{kind: intentReserve, claim: "a"}); err != nil {
		t.Fatal(err)
	}
	md := getMD(t, key)
	raise := managerTime(md)
	if raise.IsZero() || raise.Before(before.Truncate(time.Second)) || raise.After(time.Now().Add(2*time.Second)) {
		t.Fatalf("managed-fields time of %s after the raise: %v (managedFields %v)", FieldManager, raise, md.ManagedFields)
	}
	pending, _ := hub.PendingNodeClaims(md)
	if at, ok := stampOf(md, pending["a"]); !ok || !at.Equal(raise) {
		t.Fatalf("stamp of the unstamped reservation: %v %v, want the raise's %v", at, ok, raise)
	}
	// A later write (a second second) stamps it with the raise's time, not its own.
	time.Sleep(1100 * time.Millisecond)
	if err := w.do(context.Background(), key, &intent{kind: intentReserve, claim: "b"}); err != nil {
		t.Fatal(err)
	}
	md = getMD(t, key)
	pending, _ = hub.PendingNodeClaims(md)
	if !pending["a"].Equal(raise) {
		t.Fatalf("reservation a stamped %v, want the raise's %v", pending["a"], raise)
	}
	if !pending["b"].IsZero() || !managerTime(md).After(raise) {
		t.Fatalf("reservation b %v, manager time %v: b is stamped by the latest write (%v)", pending["b"], managerTime(md), raise)
	}
}

// Someone else raising and lowering the replicas at the same time keeps
// every one of their changes.
func TestWriterNeverOverwritesAConcurrentWriter(t *testing.T) {
	key := newMD(t, "shared", 5)
	w := newWriter(hubEnv.Client)
	const n = 30
	var wg sync.WaitGroup
	var writerNet atomic.Int32
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
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
			if err := w.do(context.Background(), key, &intent{kind: intentReserve, claim: fmt.Sprintf("c-%d", i)}); err != nil {
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

// A newer Cluster API's MachineDeployment fields survive the provider's
// writes: it patches only what it changes. The hub's MachineDeployment CRD
// is extended with a field this provider's types do not know.
func TestWriterKeepsFieldsItDoesNotKnow(t *testing.T) {
	ctx := context.Background()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := hubEnv.Client.Get(ctx, types.NamespacedName{Name: "machinedeployments.cluster.x-k8s.io"}, crd); err != nil {
		t.Fatal(err)
	}
	for i := range crd.Spec.Versions {
		v := &crd.Spec.Versions[i]
		if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
			continue
		}
		spec := v.Schema.OpenAPIV3Schema.Properties["spec"]
		spec.Properties["futureField"] = apiextensionsv1.JSONSchemaProps{Type: "string"}
		v.Schema.OpenAPIV3Schema.Properties["spec"] = spec
	}
	if err := hubEnv.Client.Update(ctx, crd); err != nil {
		t.Fatal(err)
	}
	key := newMD(t, "future", 1)
	// Wait until the API server serves the new schema (it prunes unknown fields until then).
	deadline := time.Now().Add(30 * time.Second)
	for {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(clusterv1.GroupVersion.WithKind("MachineDeployment"))
		if err := hubEnv.Client.Get(ctx, key, u); err != nil {
			t.Fatal(err)
		}
		_ = unstructured.SetNestedField(u.Object, "kept", "spec", "futureField")
		if err := hubEnv.Client.Update(ctx, u); err != nil {
			t.Fatal(err)
		}
		if v, _, _ := unstructured.NestedString(u.Object, "spec", "futureField"); v == "kept" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the extended CRD was not served within 30 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	w := newWriter(hubEnv.Client)
	if err := w.do(ctx, key, &intent{kind: intentReserve, claim: "x"}); err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(clusterv1.GroupVersion.WithKind("MachineDeployment"))
	if err := hubEnv.Client.Get(ctx, key, u); err != nil {
		t.Fatal(err)
	}
	replicas, _, _ := unstructured.NestedInt64(u.Object, "spec", "replicas")
	if v, _, _ := unstructured.NestedString(u.Object, "spec", "futureField"); v != "kept" || replicas != 2 {
		t.Fatalf("after the raise: spec.futureField %q, replicas %d; want \"kept\" and 2", v, replicas)
	}
}

// A raise that waits for the MachineDeployment's lock (a pass holds it)
// longer than a write may take is written once it holds the lock: the
// write's time starts there. Before, the wait used up the write's timeout
// and the raise failed as if the hub were unreachable (bench-1000: raises
// of a burst retried one by one, 40-50 s apart).
func TestARaiseWaitingForTheLockIsWrittenOnceItHoldsIt(t *testing.T) {
	key := newMD(t, "lockwait", 0)
	w := newWriter(hubEnv.Client)
	w.timeout = 2 * time.Second
	unlock := w.locks.lock(key)
	released := make(chan struct{})
	go func() {
		time.Sleep(3 * w.timeout) // a long pass
		unlock()
		close(released)
	}()
	in := &intent{kind: intentReserve, claim: "nc-lockwait"}
	if err := w.do(context.Background(), key, in); err != nil {
		t.Fatalf("the raise failed after waiting for the lock: %v", err)
	}
	<-released
	if in.err != nil || !in.raised {
		t.Fatalf("the raise was not made: err %v, raised %v", in.err, in.raised)
	}
	if got := *getMD(t, key).Spec.Replicas; got != 1 {
		t.Fatalf("replicas %d, want 1", got)
	}
}

// A scale-down's releases come over seconds: the first lowering of a
// MachineDeployment is written at once, the ones that come within
// lowerSpacing of it wait and go in one write, and any other intent is
// never held by that wait.
func TestLoweringsWithinTheSpacingRideTogether(t *testing.T) {
	key := types.NamespacedName{Namespace: "writer", Name: "spacing"}
	w := newWriter(hubEnv.Client)
	w.lowerSpacing = time.Minute
	lower := []*queued{{in: &intent{kind: intentLower, claim: "a"}}, {in: &intent{kind: intentLower, claim: "b"}}}
	if got := w.lowerWait(key, lower); got != 0 {
		t.Fatalf("the first lowering of a MachineDeployment waits %s, want 0", got)
	}
	w.lowered = map[types.NamespacedName]time.Time{key: time.Now()}
	if got := w.lowerWait(key, lower); got < 59*time.Second {
		t.Fatalf("a lowering right after a lowering write waits %s, want about the spacing (1m)", got)
	}
	mixed := append([]*queued{{in: &intent{kind: intentReserve, claim: "c"}}}, lower...)
	if got := w.lowerWait(key, mixed); got != 0 {
		t.Fatalf("a batch with a reservation waits %s for the lowering spacing, want 0", got)
	}
	if got := w.lowerWait(types.NamespacedName{Namespace: "writer", Name: "other"}, lower); got != 0 {
		t.Fatalf("another MachineDeployment's lowering waits %s, want 0", got)
	}
	w.lowered[key] = time.Now().Add(-2 * time.Minute)
	if got := w.lowerWait(key, lower); got > 0 {
		t.Fatalf("a lowering a spacing after the last waits %s, want 0", got)
	}
	w.lowerSpacing = 0
	w.lowered[key] = time.Now()
	if got := w.lowerWait(key, lower); got != 0 {
		t.Fatalf("with no spacing a lowering waits %s", got)
	}

	// A reservation queued while a lowering batch waits ends the wait.
	w.lowerSpacing = time.Minute
	q := &writeQueue{kick: make(chan struct{}, 1), running: true}
	w.queues[key] = q
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // the queue has no drain here: the reservation's wait ends with the test
	go func() { _ = w.do(ctx, key, &intent{kind: intentReserve, claim: "c"}) }()
	select {
	case <-q.kick:
	case <-time.After(10 * time.Second):
		t.Fatal("a reservation queued behind waiting lowerings did not end their wait")
	}
}
