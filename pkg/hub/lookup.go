package hub

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
)

// Lookup finds the Karpenter-managed Machines of NodeClaims, in either mode.
type Lookup struct {
	hub     *Hub
	managed *ManagedMachines
}

// NewLookup returns a Lookup over the hub cache and the providerID index.
func NewLookup(h *Hub, managed *ManagedMachines) *Lookup {
	return &Lookup{hub: h, managed: managed}
}

// Owned reports whether a Machine is in scope and carries the member label:
// the provider never changes a Machine for which this is false.
func (l *Lookup) Owned(m *clusterv1.Machine) bool {
	_, member := m.Labels[v1alpha1.KarpenterMemberLabel]
	return member && l.hub.Scope.Contains(m, m.Spec.ClusterName)
}

// Bound returns the Machine bound to the NodeClaim, or nil: one that is
// not leaving (being deleted or marked for deletion) when there is one.
func (l *Lookup) Bound(ctx context.Context, claim string) (*clusterv1.Machine, error) {
	list := &clusterv1.MachineList{}
	if err := l.hub.GetCache().List(ctx, list, client.MatchingFields{IndexMachineNodeClaim: claim}); err != nil {
		return nil, fmt.Errorf("looking up the Machine of NodeClaim %s: %w", claim, err)
	}
	// A claim may have a Machine on its way out (a failed launch released,
	// a marked Machine) and the one launched in its place: the live one is
	// the claim's Machine.
	var leaving *clusterv1.Machine
	for i := range list.Items {
		m := &list.Items[i]
		if !l.Owned(m) {
			continue
		}
		if _, marked := m.Annotations[clusterv1.DeleteMachineAnnotation]; marked || !m.DeletionTimestamp.IsZero() {
			if leaving == nil {
				leaving = m
			}
			continue
		}
		return m, nil
	}
	return leaving, nil
}

// ByProviderID returns the Karpenter-managed Machine with this providerID,
// or nil. The Machine is the informer's: do not modify it.
func (l *Lookup) ByProviderID(providerID string) (*clusterv1.Machine, error) {
	m, err := l.managed.Get(providerID)
	if err != nil {
		return nil, fmt.Errorf("looking up the Machine with providerID %s: %w", providerID, err)
	}
	return m, nil
}

// Find finds the claim's Machine: by the Machine recorded on the NodeClaim
// when known, else by providerID, else by the binding. When the cache has
// no recorded Machine, a live read decides: only NotFound from the API
// server means gone (nil, nil); any other error is returned as an error.
func (l *Lookup) Find(ctx context.Context, claim string, machine *types.NamespacedName, providerID string) (*clusterv1.Machine, error) {
	if machine != nil {
		m := &clusterv1.Machine{}
		err := l.hub.GetCache().Get(ctx, *machine, m)
		if err == nil {
			return m, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reading Machine %s: %w", machine, err)
		}
		err = l.hub.GetAPIReader().Get(ctx, *machine, m)
		switch {
		case err == nil:
			return m, nil
		case apierrors.IsNotFound(err):
			return nil, nil
		default:
			return nil, fmt.Errorf("reading Machine %s: %w", machine, err)
		}
	}
	if providerID != "" {
		m, err := l.ByProviderID(providerID)
		if err != nil || m != nil {
			return m, err
		}
	}
	return l.Bound(ctx, claim)
}

// ByHostname returns the provider's Machines (Owned) whose status.addresses
// give name as Hostname or InternalDNS, compared in canonical form (lower
// case, no trailing dot). They are the informer's: do not modify them.
func (l *Lookup) ByHostname(ctx context.Context, name string) ([]*clusterv1.Machine, error) {
	list := &clusterv1.MachineList{}
	key := strings.TrimSuffix(strings.ToLower(name), ".")
	if err := l.hub.GetCache().List(ctx, list, client.MatchingFields{IndexMachineHostname: key}); err != nil {
		return nil, fmt.Errorf("looking up the Machines named %s: %w", name, err)
	}
	var out []*clusterv1.Machine
	for i := range list.Items {
		if l.Owned(&list.Items[i]) {
			out = append(out, &list.Items[i])
		}
	}
	return out, nil
}
