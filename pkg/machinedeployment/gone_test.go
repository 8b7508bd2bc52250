package machinedeployment

import (
	"context"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// countingReader counts the reads that reach the API server.
type countingReader struct {
	client.Reader
	reads int
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.reads++
	return c.Reader.Get(ctx, key, obj, opts...)
}

// A NodeClaim a live read found gone is not read live again for a minute:
// after core's launch timeout at 1 000 NodeClaims every pass and every write
// read hundreds of gone NodeClaims live under the MachineDeployment's lock
// (bench-1000). After the minute it is read live again.
func TestAGoneNodeClaimIsReadLiveOncePerMinute(t *testing.T) {
	empty := fake.NewClientBuilder().WithScheme(scheme.Scheme).Build()
	live := &countingReader{Reader: empty}
	now := time.Date(2026, 11, 29, 3, 0, 0, 0, time.UTC)
	p := &Provider{spoke: empty, spokeAPI: live, now: func() time.Time { return now }}
	p.gone.now = p.now
	for i := 0; i < 5; i++ {
		if !p.claimFree(context.Background(), "nc-gone") {
			t.Fatal("a NodeClaim neither the cache nor the API server has is not free")
		}
	}
	if live.reads != 1 {
		t.Fatalf("%d live reads for five questions within a minute, want 1", live.reads)
	}
	now = now.Add(goneTTL)
	if !p.claimFree(context.Background(), "nc-gone") {
		t.Fatal("not free after the minute")
	}
	if live.reads != 2 {
		t.Fatalf("%d live reads after the minute, want 2 (read again)", live.reads)
	}
}
