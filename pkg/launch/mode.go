package launch

import (
	"context"
	"errors"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
)

// ErrMachineGone means the NodeClaim's Machine is truly gone: a live read
// said so, never a cache miss or an API error.
var ErrMachineGone = errors.New("machine not found")

// ErrStillLaunching means no providerID arrived within one call's wait; the
// launch goes on and the next call resumes it.
var ErrStillLaunching = errors.New("machine has no providerID yet")

// Choose finds the cheapest available offerings of a set that the NodeClaim
// fits, and returns the sources that launch them: one, or several when
// offerings or origins tie on price, the first being the one found first in
// the set's order. Price is the cloud provider's call (prices are what
// Karpenter schedules with, NodeOverlays applied); which of equal sources
// launches is the mode's. A mode calls it again after marking a failed
// offering unavailable, to fall back within one launch. It fails for a
// NodeClaim that is being deleted, so that no new Machine is made for it,
// and never returns an empty list without an error.
type Choose func(*instancetype.Set) ([]instancetype.Source, error)

// Launched is a Machine whose instance has a providerID, launched for a
// NodeClaim.
type Launched struct {
	Machine *clusterv1.Machine
	// ProviderID is the instance's (see ProviderIDOf): the Machine may get
	// it only later.
	ProviderID string
	// Source is what the Machine was launched from, with the NodeClass's
	// kubelet settings: the labels, capacity and allocatable Karpenter
	// planned with.
	Source instancetype.Source
	// Annotations the mode recorded on the NodeClaim (its choices), for
	// the NodeClaim Create returns.
	Annotations map[string]string
	// From names what the Machine was made from, for users' events
	// ("MachineDeployment ns/name", "AWSMachineTemplate ns/name").
	From string
	// Announced: the mode has already told the NodeClaim's events which
	// Machine it got and what it was made from (MachineDeployment mode's
	// MachineBound); Create records no Launched event of its own, which
	// would say it a second time (the instance type, zone, capacity type
	// and providerID are the NodeClaim's labels and status).
	Announced bool
}

// Mode turns NodeClaims into Cluster API objects in one way. The cloud
// provider dispatches each call to exactly one Mode: by the NodeClass for
// instance types, launches and drift, by the Machine for the rest.
type Mode interface {
	// Serves reports whether the NodeClass is of this mode.
	Serves(nodeClass *v1alpha1.ClusterAPINodeClass) bool
	// InstanceTypes resolves the NodeClass to its instance types, every
	// one, also those without an available offering, and what each
	// offering launches from.
	InstanceTypes(ctx context.Context, nodeClass *v1alpha1.ClusterAPINodeClass) (*instancetype.Set, error)
	// Launch makes sure a Machine runs for the NodeClaim and returns it
	// once its instance has a providerID (ProviderIDOf), resuming whatever an earlier call (of this
	// process or one before a restart) started. It records its choices on
	// nodeClaim's annotations before acting on them (Karpenter persists
	// them even when Launch fails). A launch the infrastructure reports
	// failed for lack of capacity makes its offering unavailable and the
	// next choice is tried within the same call; when none is left, the
	// error is Karpenter's InsufficientCapacityError. No providerID within
	// the wait: an error wrapping ErrStillLaunching.
	Launch(ctx context.Context, nodeClass *v1alpha1.ClusterAPINodeClass, nodeClaim *karpv1.NodeClaim, choose Choose) (*Launched, error)
	// Owns reports whether this mode launched the Machine.
	Owns(m *clusterv1.Machine) bool
	// Describe returns what the Machine was launched from, for the
	// NodeClaim's labels and resources; false when that is not known.
	Describe(m *clusterv1.Machine) (instancetype.Source, bool)
	// Release starts removing the NodeClaim's Machine m, or, when m is nil
	// (none found), whatever this mode started for the claim. It returns
	// ErrMachineGone once nothing of the claim's is left.
	Release(ctx context.Context, claim string, m *clusterv1.Machine) error
	// Drifted reports why the Machine no longer matches what the NodeClass
	// would launch now, or "".
	Drifted(ctx context.Context, nodeClass *v1alpha1.ClusterAPINodeClass, m *clusterv1.Machine) (cloudprovider.DriftReason, error)
}
