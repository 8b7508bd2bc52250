// Package spoke holds reads of the workload cluster that more than one mode
// relies on to decide something destructive.
package spoke

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// NodeClaimGone reports whether a NodeClaim is gone: absent from the cache
// (cached) AND from a live read (live), with since (when the object that
// names it was made or recorded) longer ago than grace. Any error is
// returned as an error, never taken as gone: the caller deletes or gives
// back capacity on a true answer.
func NodeClaimGone(ctx context.Context, cached, live client.Reader, claim string, since, now time.Time, grace time.Duration) (bool, error) {
	if now.Sub(since) < grace {
		return false, nil
	}
	nc := &karpv1.NodeClaim{}
	err := cached.Get(ctx, types.NamespacedName{Name: claim}, nc)
	if err == nil || !apierrors.IsNotFound(err) {
		return false, client.IgnoreNotFound(err)
	}
	err = live.Get(ctx, types.NamespacedName{Name: claim}, nc)
	switch {
	case err == nil:
		return false, nil
	case apierrors.IsNotFound(err):
		return true, nil
	default:
		return false, fmt.Errorf("reading NodeClaim %s: %w", claim, err)
	}
}

// Ours reports whether a NodeClaim is this provider's: its NodeClass is a
// ClusterAPINodeClass.
func Ours(nc *karpv1.NodeClaim) bool {
	return nc.Spec.NodeClassRef != nil && nc.Spec.NodeClassRef.Group == v1alpha1.Group
}
