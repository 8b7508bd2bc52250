package machinegone

import (
	"context"
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// finder answers Find as the hub would: a Machine, nil (a live read said
// it does not exist), or an error (the hub does not answer).
type finder struct {
	m   *clusterv1.Machine
	err error
}

func (f finder) Find(context.Context, string, *types.NamespacedName, string) (*clusterv1.Machine, error) {
	return f.m, f.err
}

func nodeClaim(mutate func(*karpv1.NodeClaim)) *karpv1.NodeClaim {
	nc := &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c", UID: "uid-c", Annotations: map[string]string{v1alpha1.MachineAnnotation: "ns/m"}},
		Spec:       karpv1.NodeClaimSpec{NodeClassRef: &karpv1.NodeClassReference{Group: v1alpha1.Group, Kind: "ClusterAPINodeClass", Name: "nc"}},
		Status:     karpv1.NodeClaimStatus{ProviderID: "aws:///us-east-1a/i-1"},
	}
	nc.StatusConditions().SetTrue(karpv1.ConditionTypeLaunched)
	if mutate != nil {
		mutate(nc)
	}
	return nc
}

// The NodeClaim is deleted only when its Machine is known to be leaving or
// gone; never on an error, never when it registered (core's garbage
// collection), never when it is not launched or not this provider's.
func TestDeletesOnlyWhenTheMachineIsSurelyGone(t *testing.T) {
	now := metav1.Now()
	deleting := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: "ns", DeletionTimestamp: &now, Finalizers: []string{"x"}}}
	live := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: "ns"}}
	cases := []struct {
		name    string
		nc      *karpv1.NodeClaim
		find    finder
		deleted bool
		wantErr bool
	}{
		{"Machine gone (live read)", nodeClaim(nil), finder{}, true, false},
		{"Machine being deleted", nodeClaim(nil), finder{m: deleting}, true, false},
		{"Machine there", nodeClaim(nil), finder{m: live}, false, false},
		{"hub does not answer", nodeClaim(nil), finder{err: errors.New("connection refused")}, false, true},
		{"registered: core's garbage collection decides", nodeClaim(func(nc *karpv1.NodeClaim) {
			nc.StatusConditions().SetTrue(karpv1.ConditionTypeRegistered)
		}), finder{}, false, false},
		{"not launched: the launch handles its Machine", nodeClaim(func(nc *karpv1.NodeClaim) { nc.Status.ProviderID = "" }), finder{}, false, false},
		{"no Machine named", nodeClaim(func(nc *karpv1.NodeClaim) { delete(nc.Annotations, v1alpha1.MachineAnnotation) }), finder{}, false, false},
		{"another provider's NodeClaim", nodeClaim(func(nc *karpv1.NodeClaim) { nc.Spec.NodeClassRef.Group = "karpenter.k8s.aws" }), finder{}, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			kube := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(c.nc).WithStatusSubresource(c.nc).Build()
			ctrl := NewController(kube, nil, c.find)
			_, err := ctrl.Reconcile(context.Background(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(c.nc)})
			if (err != nil) != c.wantErr {
				t.Fatalf("err = %v, want error: %v", err, c.wantErr)
			}
			err = kube.Get(context.Background(), client.ObjectKeyFromObject(c.nc), &karpv1.NodeClaim{})
			if gone := apierrors.IsNotFound(err); gone != c.deleted {
				t.Fatalf("NodeClaim deleted: %v, want %v", gone, c.deleted)
			}
		})
	}
}
