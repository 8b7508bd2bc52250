package machinedeployment

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

func spreadScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	// Karpenter's types register themselves in client-go's scheme.
	s := clientgoscheme.Scheme
	if err := clusterv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

func tie(name string) instancetype.Source {
	return instancetype.Source{Origin: types.NamespacedName{Namespace: "ns", Name: name}, Name: "m5.large", Zone: "us-east-1a", Price: 0.096, Available: true}
}

// A burst over four MachineDeployments of the same offering and price is
// shared between them (each MachineSet makes its Machines one after
// another, so one MachineDeployment for the whole burst is the slowest
// choice), a claim always lands on the same one whatever order the ties
// come in, and a single choice is taken as it is.
func TestABurstIsSpreadOverMachineDeploymentsOfTheSamePrice(t *testing.T) {
	ctx := context.Background()
	s := spreadScheme(t)
	mds := fake.NewClientBuilder().WithScheme(s).Build()
	claims := fake.NewClientBuilder().WithScheme(s).Build()
	ties := []instancetype.Source{tie("md-d"), tie("md-b"), tie("md-a"), tie("md-c")}
	reversed := []instancetype.Source{ties[3], ties[2], ties[1], ties[0]}
	per := map[string]int{}
	for i := 0; i < 400; i++ {
		claim := fmt.Sprintf("pool-%05d", i*7919%100000)
		got := spreadOver(ctx, claim, ties, mds, claims)
		if again := spreadOver(ctx, claim, reversed, mds, claims); again.Origin != got.Origin {
			t.Fatalf("NodeClaim %s: %s, then %s with the ties in another order", claim, got.Origin, again.Origin)
		}
		per[got.Origin.Name]++
	}
	for _, name := range []string{"md-a", "md-b", "md-c", "md-d"} {
		if per[name] < 60 {
			t.Errorf("MachineDeployment %s got %d of 400 NodeClaims (all: %v): the burst is not shared", name, per[name], per)
		}
	}
	if got := spreadOver(ctx, "pool-1", ties[:1], mds, claims); got.Origin.Name != "md-d" {
		t.Errorf("one choice: got %s, want md-d", got.Origin)
	}
}

// A MachineDeployment holding a reservation whose NodeClaim is gone (core
// deleted it before its launch) is chosen first, whatever the hash says:
// the reserving write takes that reservation over, and the Machine made for
// it, instead of raising on another MachineDeployment while this one's is
// given back. A reservation of a NodeClaim that still exists is not free.
func TestASuccessorGoesWhereAFreeReservationWaits(t *testing.T) {
	ctx := context.Background()
	s := spreadScheme(t)
	withPending := func(name string, claims ...string) *clusterv1.MachineDeployment {
		md := &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
		pending := map[string]time.Time{}
		for _, c := range claims {
			pending[c] = time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC)
		}
		hub.SetPendingNodeClaims(md, pending)
		return md
	}
	live := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "alive"}}
	nodeClaims := fake.NewClientBuilder().WithScheme(s).WithObjects(live).Build()
	ties := []instancetype.Source{tie("md-a"), tie("md-b"), tie("md-c")}

	// md-c holds the reservation of a gone NodeClaim; md-a one of a live one.
	mds := fake.NewClientBuilder().WithScheme(s).WithObjects(withPending("md-a", "alive"), withPending("md-b"), withPending("md-c", "timed-out")).Build()
	for i := 0; i < 50; i++ {
		claim := fmt.Sprintf("successor-%d", i)
		if got := spreadOver(ctx, claim, ties, mds, nodeClaims); got.Origin.Name != "md-c" {
			t.Fatalf("NodeClaim %s went to %s, want md-c, which holds the free reservation of timed-out", claim, got.Origin)
		}
	}
	// Once taken over, the hash decides again: not all to md-c.
	mds = fake.NewClientBuilder().WithScheme(s).WithObjects(withPending("md-a", "alive"), withPending("md-b"), withPending("md-c", "alive")).Build()
	per := map[string]int{}
	for i := 0; i < 60; i++ {
		per[spreadOver(ctx, fmt.Sprintf("successor-%d", i), ties, mds, nodeClaims).Origin.Name]++
	}
	if len(per) != 3 {
		t.Fatalf("with no free reservation, 60 NodeClaims went to %v, want all three MachineDeployments", per)
	}
	// No NodeClaim reader: the hash alone.
	if got := spreadOver(ctx, "successor-0", ties, mds, nil); got.Origin != spreadOver(ctx, "successor-0", ties, mds, nodeClaims).Origin {
		t.Fatalf("without a NodeClaim reader, successor-0 went to %s", got.Origin)
	}
}
