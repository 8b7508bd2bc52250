package cloudprovider

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	corecloudprovider "sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// failingReader is an API server that does not answer.
type failingReader struct{ client.Reader }

func (failingReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return apierrors.NewServiceUnavailable("the workload cluster is unreachable")
}

func nodeClassReady(name string, ready bool) *v1alpha1.ClusterAPINodeClass {
	nc := &v1alpha1.ClusterAPINodeClass{ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1}}
	nc.Spec.ScalableResourceSelector = &metav1.LabelSelector{}
	if ready {
		nc.StatusConditions().SetTrue(v1alpha1.ConditionTypeInstanceTypesResolved)
	} else {
		nc.StatusConditions().SetFalse(v1alpha1.ConditionTypeInstanceTypesResolved, "TestingNotReady", "marked not Ready")
	}
	return nc
}

// Create answers about the NodeClass as the API server has it: Karpenter's
// own suite marks a NodeClass not Ready and at once creates a NodeClaim,
// which must be deleted, not launched from the cache's older Ready copy
// (CI at 2be245f: the spec timed out with the node launched). A NodeClass
// the cache does not show yet is not a reason to delete the NodeClaim, and
// an API server that does not answer leaves the decision to the cache.
func TestCreateDecidesOnTheNodeClassTheAPIServerHas(t *testing.T) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	cache := fake.NewClientBuilder().WithScheme(s).WithObjects(nodeClassReady("marked", true)).Build()
	api := fake.NewClientBuilder().WithScheme(s).WithObjects(nodeClassReady("marked", false), nodeClassReady("new", true)).Build()
	c := &CloudProvider{kubeClient: cache}
	c.ReadLiveWith(api)
	ctx := context.Background()
	claim := func(nodeClass string) *karpv1.NodeClaim {
		return &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "claim-" + nodeClass},
			Spec: karpv1.NodeClaimSpec{NodeClassRef: &karpv1.NodeClassReference{Group: v1alpha1.Group, Kind: "ClusterAPINodeClass", Name: nodeClass}}}
	}

	// (No mode is set up: past the readiness check, Create would answer
	// NodeClassNotReady too, for want of a mode; the message tells which.)
	if _, err := c.Create(ctx, claim("marked")); !corecloudprovider.IsNodeClassNotReadyError(err) || !strings.Contains(err.Error(), v1alpha1.ConditionTypeInstanceTypesResolved) {
		t.Errorf("NodeClass not Ready in the API server, Ready in the cache: got %v, want a NodeClassNotReady error naming its condition", err)
	}
	nc, err := c.launchNodeClass(ctx, claim("new").Spec.NodeClassRef)
	if err != nil || !nc.StatusConditions().Get("Ready").IsTrue() {
		t.Errorf("NodeClass the cache does not show yet: got %v, %v; want the API server's Ready copy", nc, err)
	}
	if _, err := c.Create(ctx, claim("gone")); !corecloudprovider.IsInsufficientCapacityError(err) {
		t.Errorf("NodeClass in neither: got %v, want an InsufficientCapacity error (core deletes the NodeClaim)", err)
	}

	c.ReadLiveWith(failingReader{})
	nc, err = c.launchNodeClass(ctx, claim("marked").Spec.NodeClassRef)
	if err != nil || !nc.StatusConditions().Get("Ready").IsTrue() {
		t.Errorf("API server unreachable: got %v, %v; want the cache's copy", nc, err)
	}
}
