package spoke

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// failing is a reader whose every read fails, like an API server that does
// not answer.
type failing struct{ client.Reader }

func (failing) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return errors.New("connection refused")
}

func TestNodeClaimGoneOnlyWhenBothReadsSayNotFound(t *testing.T) {
	// Karpenter's types register themselves in client-go's scheme.
	scheme := clientgoscheme.Scheme
	present := fake.NewClientBuilder().WithScheme(scheme).WithObjects(&karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "c"}}).Build()
	absent := fake.NewClientBuilder().WithScheme(scheme).Build()
	ctx, now := context.Background(), time.Now()
	old := now.Add(-time.Minute)
	cases := []struct {
		name          string
		cached, live  client.Reader
		since         time.Time
		gone, wantErr bool
	}{
		{"in the cache", present, absent, old, false, false},
		{"cache lags, live read finds it", absent, present, old, false, false},
		{"gone from both, past the grace period", absent, absent, old, true, false},
		{"gone from both, within the grace period", absent, absent, now, false, false},
		{"live read fails: an error, never gone", absent, failing{}, old, false, true},
		{"cache read fails: an error, never gone", failing{}, absent, old, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gone, err := NodeClaimGone(ctx, c.cached, c.live, "c", c.since, now, 30*time.Second)
			if gone != c.gone || (err != nil) != c.wantErr {
				t.Fatalf("gone=%v err=%v, want gone=%v err=%v", gone, err, c.gone, c.wantErr)
			}
		})
	}
}
