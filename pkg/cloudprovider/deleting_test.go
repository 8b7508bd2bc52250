package cloudprovider

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

// A NodeClaim Karpenter deleted (its launch timeout) while a Create was on
// its way is not launched: recording the launch made core Delete the
// instance that had just come, beside the successor's (make bench-1000).
func TestCreateRefusesANodeClaimBeingDeleted(t *testing.T) {
	created := metav1.NewTime(time.Now().Add(-6 * time.Minute))
	deleting := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "deleting", UID: "u1", CreationTimestamp: created,
		DeletionTimestamp: &created, Finalizers: []string{karpv1.TerminationFinalizer}}}
	live := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "live", UID: "u2", CreationTimestamp: created}}
	c := &CloudProvider{kubeClient: fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(deleting.DeepCopy(), live.DeepCopy()).Build()}
	ctx := context.Background()

	// What core's reconcile holds: read before the deletion.
	stale := deleting.DeepCopy()
	stale.DeletionTimestamp = nil
	if err := c.notDeleting(ctx, stale); !errors.Is(err, errNodeClaimDeleting) {
		t.Errorf("NodeClaim being deleted: got %v, want %v", err, errNodeClaimDeleting)
	}
	// Not in the cache: maybe created a moment ago; no proof of a deletion.
	unseen := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "unseen", UID: "u3", CreationTimestamp: created}}
	if err := c.notDeleting(ctx, unseen); err != nil {
		t.Errorf("NodeClaim the cache does not show: %v", err)
	}
	replaced := live.DeepCopy()
	replaced.UID = "u-old"
	if err := c.notDeleting(ctx, replaced); !errors.Is(err, errNodeClaimDeleting) {
		t.Errorf("NodeClaim gone and another made under its name: got %v, want %v", err, errNodeClaimDeleting)
	}
	if err := c.notDeleting(ctx, live); err != nil {
		t.Errorf("live NodeClaim: %v", err)
	}

	// With the API server to ask: a NodeClaim the cache does not show is
	// launched only when the API server has it (created a moment ago),
	// not when it is gone there too (core's reconcile on a stale copy,
	// conformance run H).
	fresh := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "fresh", UID: "u4", CreationTimestamp: created}}
	c.ReadLiveWith(fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(fresh.DeepCopy(), deleting.DeepCopy()).Build())
	if err := c.notDeleting(ctx, fresh); err != nil {
		t.Errorf("NodeClaim the cache does not show yet, in the API server: %v", err)
	}
	if err := c.notDeleting(ctx, unseen); !errors.Is(err, errNodeClaimDeleting) {
		t.Errorf("NodeClaim gone from the cache and the API server: got %v, want %v", err, errNodeClaimDeleting)
	}
}

// A launch that falls back asks Choose for the next offering: for a
// NodeClaim core deleted while the failed launch waited (its launch
// timeout), the answer is no, so no new Machine is made for it
// (conformance run F: one such fallback held core's cluster state unsynced
// for minutes).
func TestChooseRefusesANodeClaimDeletedMeanwhile(t *testing.T) {
	created := metav1.NewTime(time.Now().Add(-6 * time.Minute))
	nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "claim", UID: "u1", CreationTimestamp: created,
		Finalizers: []string{karpv1.TerminationFinalizer}}}
	kube := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(nc.DeepCopy()).Build()
	c := &CloudProvider{kubeClient: kube}
	ctx := context.Background()
	choose := c.chooser(ctx, nc.DeepCopy())

	// Live: the choice is the set's (here empty: no offering fits).
	if _, err := choose(&instancetype.Set{}); err == nil || errors.Is(err, errNodeClaimDeleting) {
		t.Fatalf("live NodeClaim, empty set: got %v, want the set's own error", err)
	}
	if err := kube.Delete(ctx, nc.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	if _, err := choose(&instancetype.Set{}); !errors.Is(err, errNodeClaimDeleting) {
		t.Errorf("NodeClaim deleted after the first launch: got %v, want %v", err, errNodeClaimDeleting)
	}
}
