// Package cloudprovider implements Karpenter's CloudProvider for Cluster API.
// It orchestrates: each call goes to the one mode (launch.Mode) that serves
// the NodeClass or launched the Machine; the Cluster API plumbing lives in
// the mode packages.
package cloudprovider

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/awslabs/operatorpkg/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/events"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/launch"
	"github.com/autonode/karpenter-clusterapi/pkg/operator/options"
)

// Name of this cloud provider, as Karpenter reports it.
const Name = "clusterapi"

// CloudProvider turns NodeClaims into Cluster API objects and back.
type CloudProvider struct {
	kubeClient client.Client // the workload cluster
	managed    *hub.ManagedMachines
	machines   *hub.Lookup
	modes      []launch.Mode
	// priced returns the instance types with the prices Karpenter uses
	// (NodeOverlays applied); Create picks the cheapest by those.
	priced cloudprovider.CloudProvider
	// hubBack waits until an unreachable hub answers again (nil: no waiting).
	hubBack func(context.Context) error
	// events records Launched events on NodeClaims (nil: none).
	events events.Recorder
	// extraRepair are the repair policies of --repair-conditions.
	extraRepair []cloudprovider.RepairPolicy
	// live reads from the workload cluster's API server what Create must
	// not take from a lagging cache: the NodeClass it launches from, and a
	// NodeClaim the cache does not show (nil: the cache decides).
	live client.Reader
}

// ReadLiveWith makes Create read its NodeClass from the API server, and a
// NodeClaim its cache does not show: gone there, it is not launched.
func (c *CloudProvider) ReadLiveWith(r client.Reader) { c.live = r }

// WaitForHubWith makes Create wait out an unreachable hub, up to
// hubOutageWait, rather than fail at once: core backs off a failed launch
// by up to a minute, so a pending pod would wait that long after the hub's
// return. wait returns once the hub answers (hub.Reachability.Wait).
func (c *CloudProvider) WaitForHubWith(wait func(context.Context) error) { c.hubBack = wait }

// hubOutageWait bounds how long one Create waits for an unreachable hub, like
// a mode's wait for a Machine's providerID: core's launch worker is blocked
// meanwhile.
const hubOutageWait = 2 * time.Minute

// UsePricesFrom makes Create choose offerings by the prices p reports, the
// decorated provider core schedules with, so that NodeOverlay price changes
// decide launches too.
func (c *CloudProvider) UsePricesFrom(p cloudprovider.CloudProvider) { c.priced = p }

var _ cloudprovider.CloudProvider = (*CloudProvider)(nil)

// New returns the cloud provider over the given modes. managed and machines
// find the Karpenter-managed Machines of either mode.
func New(kubeClient client.Client, managed *hub.ManagedMachines, machines *hub.Lookup, modes ...launch.Mode) *CloudProvider {
	return &CloudProvider{kubeClient: kubeClient, managed: managed, machines: machines, modes: modes}
}

// modeFor returns the mode serving the NodeClass, or nil.
func (c *CloudProvider) modeFor(nodeClass *v1alpha1.ClusterAPINodeClass) launch.Mode {
	for _, m := range c.modes {
		if m.Serves(nodeClass) {
			return m
		}
	}
	return nil
}

// modeOf returns the mode that launched the Machine, or nil.
func (c *CloudProvider) modeOf(m *clusterv1.Machine) launch.Mode {
	for _, mode := range c.modes {
		if mode.Owns(m) {
			return mode
		}
	}
	return nil
}

// Create launches a Machine for the NodeClaim and returns the NodeClaim
// with its providerID, labels and resources, once the Machine has one.
func (c *CloudProvider) Create(ctx context.Context, nodeClaim *karpv1.NodeClaim) (*karpv1.NodeClaim, error) {
	nodeClass, err := c.launchNodeClass(ctx, nodeClaim.Spec.NodeClassRef)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, cloudprovider.NewInsufficientCapacityError(fmt.Errorf("resolving NodeClass of NodeClaim %s: %w", nodeClaim.Name, err))
		}
		return nil, fmt.Errorf("resolving NodeClass of NodeClaim %s: %w", nodeClaim.Name, err)
	}
	if ready := nodeClass.StatusConditions().Get(status.ConditionReady); ready.IsFalse() {
		return nil, cloudprovider.NewNodeClassNotReadyError(fmt.Errorf("ClusterAPINodeClass %s: %s", nodeClass.Name, ready.Message))
	}
	mode := c.modeFor(nodeClass)
	if mode == nil {
		return nil, cloudprovider.NewNodeClassNotReadyError(fmt.Errorf("ClusterAPINodeClass %s: neither spec.scalableResourceSelector nor spec.machineTemplate is set", nodeClass.Name))
	}
	if err := c.notDeleting(ctx, nodeClaim); err != nil {
		return nil, err
	}
	choose := c.chooser(ctx, nodeClaim)
	var launched *launch.Launched
	err = c.throughHubOutage(ctx, func() error {
		var err error
		launched, err = mode.Launch(ctx, nodeClass, nodeClaim, choose)
		return err
	})
	if err != nil {
		if errors.Is(err, launch.ErrStillLaunching) {
			return nil, cloudprovider.NewCreateError(err, "MachineLaunching", truncate(err.Error()))
		}
		return nil, err
	}
	m := launched.Machine
	if err := c.notDeleting(ctx, nodeClaim); err != nil {
		// Deleted while its instance was on its way: the launch is not
		// recorded, so the NodeClaim goes without a Delete, and its Machine
		// is left to the successor Karpenter makes for the same pods
		// (MachineDeployment mode adopts it) or to the garbage collector.
		return nil, err
	}
	// Record the Machine on the NodeClaim: core persists it even when a
	// later step fails, and Delete finds the Machine by it.
	if nodeClaim.Annotations == nil {
		nodeClaim.Annotations = map[string]string{}
	}
	v1alpha1.SetMachineRef(nodeClaim.Annotations, m.Namespace, m.Name)
	// Core keeps what Create returns: its own copy of what the mode shares.
	created := c.nodeClaimOf(m, launched.ProviderID, launched.Source, true).DeepCopy()
	created.Annotations = map[string]string{}
	v1alpha1.SetMachineRef(created.Annotations, m.Namespace, m.Name)
	for k, v := range launched.Annotations {
		created.Annotations[k] = v
	}
	c.launched(nodeClaim, m, created, launched.From, launched.Announced)
	return created, nil
}

// errNodeClaimDeleting is Create's answer for a NodeClaim being deleted.
var errNodeClaimDeleting = errors.New("being deleted: not launched")

// notDeleting refuses a launch for a NodeClaim that is being deleted (or
// replaced by another of the same name). Core's launch timeout deletes a NodeClaim while a reconcile that read
// it just before (its cache lags under load) may still call Create, or while
// a Create waits for the instance's ID: recording that launch made core
// Delete the instance it had just got, while its successor raised another
// (make bench-1000: 30 such NodeClaims lingered beside their successors).
// A read error, or a cache that does not show the NodeClaim, is no reason to
// refuse.
func (c *CloudProvider) notDeleting(ctx context.Context, nodeClaim *karpv1.NodeClaim) error {
	current := &karpv1.NodeClaim{}
	err := c.kubeClient.Get(ctx, client.ObjectKeyFromObject(nodeClaim), current)
	if apierrors.IsNotFound(err) && c.live != nil {
		// A cache may not show a NodeClaim created a moment ago (the
		// configuration matrix calls Create right after creating one):
		// the API server decides. Gone there, it is not launched: core's
		// lifecycle controller, on a cache that lags under load, called
		// Create for a NodeClaim deleted 2 s before, and its Machine ran
		// without a NodeClaim until the orphan release (conformance run
		// H, StaticCapacity: a drift replacement core's static
		// deprovisioning deleted at once).
		err = c.live.Get(ctx, client.ObjectKeyFromObject(nodeClaim), current)
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("NodeClaim %s is gone: %w", nodeClaim.Name, errNodeClaimDeleting)
		}
	}
	switch {
	case err != nil:
		// No proof of a deletion (no live reader, or an error): the
		// NodeClaim core launches cannot go while Create runs (its
		// finalizer is removed by the same reconciler, which is busy here).
		return nil
	case nodeClaim.UID != "" && current.UID != nodeClaim.UID:
		return fmt.Errorf("NodeClaim %s: %w", nodeClaim.Name, errNodeClaimDeleting)
	case !current.DeletionTimestamp.IsZero():
		return fmt.Errorf("NodeClaim %s: %w", nodeClaim.Name, errNodeClaimDeleting)
	}
	return nil
}

// chooser returns the launch.Choose of a NodeClaim: the cheapest offering,
// asked for each time a mode is about to launch a new Machine (the first,
// and again after each failed launch). A NodeClaim core deleted meanwhile
// is launched no further: core's 5-minute launch timeout deletes a
// NodeClaim whose Create is still waiting for its instance, and a fallback
// launch then made another Machine for it and held the Create (and with it
// core's cluster state, unsynced while a NodeClaim has no providerID, and
// all provisioning) for minutes more (conformance run F, Machine mode,
// regression/Utilization).
func (c *CloudProvider) chooser(ctx context.Context, nodeClaim *karpv1.NodeClaim) launch.Choose {
	return func(set *instancetype.Set) ([]instancetype.Source, error) {
		if err := c.notDeleting(ctx, nodeClaim); err != nil {
			return nil, err
		}
		return cheapest(set, c.pricedInstanceTypes(ctx, nodeClaim, set), nodeClaim)
	}
}

// throughHubOutage runs launch, and again each time the hub answers after
// launch failed because it was unreachable, for up to hubOutageWait. A
// launch resumes from what the earlier attempts recorded.
func (c *CloudProvider) throughHubOutage(ctx context.Context, launch func() error) error {
	err := launch()
	if c.hubBack == nil || !hub.Unreachable(err) {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, hubOutageWait)
	defer cancel()
	for hub.Unreachable(err) {
		if c.hubBack(wctx) != nil {
			return err // still unreachable: core retries later
		}
		err = launch()
	}
	return err
}

// Delete removes the NodeClaim's Machine. It returns NodeClaimNotFoundError
// once the Machine is gone.
func (c *CloudProvider) Delete(ctx context.Context, nodeClaim *karpv1.NodeClaim) error {
	var ref *types.NamespacedName
	if v := nodeClaim.Annotations[v1alpha1.MachineAnnotation]; v != "" {
		ns, name, ok := v1alpha1.MachineRef(nodeClaim.Annotations)
		if !ok {
			return fmt.Errorf("NodeClaim %s: annotation %s %q names no Machine (a name beside %s, or <namespace>/<name>)",
				nodeClaim.Name, v1alpha1.MachineAnnotation, v, v1alpha1.MachineNamespaceAnnotation)
		}
		ref = &types.NamespacedName{Namespace: ns, Name: name}
	}
	m, err := c.machines.Find(ctx, nodeClaim.Name, ref, nodeClaim.Status.ProviderID)
	if err != nil {
		return err
	}
	if m != nil {
		mode := c.modeOf(m)
		if mode == nil {
			return fmt.Errorf("Machine %s/%s of NodeClaim %s was launched by neither mode: not touching it", m.Namespace, m.Name, nodeClaim.Name)
		}
		err = mode.Release(ctx, nodeClaim.Name, m)
	} else {
		// No Machine: each mode removes whatever it started for the claim
		// (a replica raised, objects of an interrupted launch).
		err = launch.ErrMachineGone
		for _, mode := range c.modes {
			if rerr := mode.Release(ctx, nodeClaim.Name, nil); rerr != nil && !errors.Is(rerr, launch.ErrMachineGone) {
				err = rerr
			}
		}
	}
	if errors.Is(err, launch.ErrMachineGone) {
		return cloudprovider.NewNodeClaimNotFoundError(fmt.Errorf("NodeClaim %s: Machine is gone", nodeClaim.Name))
	}
	return err
}

// Get returns the NodeClaim of the Machine with this providerID.
func (c *CloudProvider) Get(ctx context.Context, providerID string) (*karpv1.NodeClaim, error) {
	m, err := c.machines.ByProviderID(providerID)
	if err != nil {
		return nil, err
	}
	if m == nil {
		return nil, cloudprovider.NewNodeClaimNotFoundError(fmt.Errorf("no Karpenter-managed Machine has providerID %s", providerID))
	}
	return c.toNodeClaim(m, providerID), nil
}

// List returns a NodeClaim for every Karpenter-managed Machine with a
// providerID: its own, or its infrastructure machine's until Cluster API
// copies it.
func (c *CloudProvider) List(ctx context.Context) ([]*karpv1.NodeClaim, error) {
	out := make([]*karpv1.NodeClaim, 0, c.managed.Len())
	if err := c.managed.List(func(m *clusterv1.Machine, providerID string) {
		out = append(out, c.toNodeClaim(m, providerID))
	}); err != nil {
		return nil, fmt.Errorf("listing Machines: %w", err)
	}
	return out, nil
}

// GetInstanceTypes returns every instance type the NodePool's NodeClass
// resolves to, including those without available offerings.
func (c *CloudProvider) GetInstanceTypes(ctx context.Context, nodePool *karpv1.NodePool) ([]*cloudprovider.InstanceType, error) {
	nodeClass, err := c.nodeClass(ctx, nodePool.Spec.Template.Spec.NodeClassRef)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("resolving NodeClass of NodePool %s: %w", nodePool.Name, err)
	}
	mode := c.modeFor(nodeClass)
	if mode == nil {
		return nil, nil
	}
	set, err := mode.InstanceTypes(ctx, nodeClass)
	if err != nil {
		return nil, err
	}
	return set.InstanceTypes, nil
}

// liveReadTimeout bounds Create's read of its NodeClass from the API server.
const liveReadTimeout = 5 * time.Second

// launchNodeClass is the NodeClass Create launches from: as the API server
// has it, when a live reader is set. Both of Create's answers about the
// NodeClass delete the NodeClaim (not found, not Ready) or launch a node
// (Ready), so they follow the latest write, not a cache that lags under
// load: Karpenter's own suite marks a NodeClass not Ready and at once
// creates a NodeClaim for it, which the cache's Ready copy launched (CI at
// 2be245f). A live read that fails is no answer: the cache's copy decides.
func (c *CloudProvider) launchNodeClass(ctx context.Context, ref *karpv1.NodeClassReference) (*v1alpha1.ClusterAPINodeClass, error) {
	cached, err := c.nodeClass(ctx, ref)
	if c.live == nil || ref == nil {
		return cached, err
	}
	// Bounded: a workload cluster that does not answer (a partition, not
	// a refused connection) must not hold the launch; the cache decides.
	readCtx, cancel := context.WithTimeout(ctx, liveReadTimeout)
	defer cancel()
	live := &v1alpha1.ClusterAPINodeClass{}
	liveErr := c.live.Get(readCtx, types.NamespacedName{Name: ref.Name}, live)
	switch {
	case liveErr == nil:
		log.FromContext(ctx).V(1).Info("NodeClass read for a launch", "NodeClass", ref.Name, "resourceVersion", live.ResourceVersion,
			"ready", live.StatusConditions().Get(status.ConditionReady).GetStatus())
		return live, nil
	case apierrors.IsNotFound(liveErr):
		return nil, liveErr
	}
	log.FromContext(ctx).Info("reading the NodeClass from the workload cluster failed: the launch decides on the cache", "NodeClass", ref.Name, "error", liveErr)
	return cached, err
}

func (c *CloudProvider) nodeClass(ctx context.Context, ref *karpv1.NodeClassReference) (*v1alpha1.ClusterAPINodeClass, error) {
	if ref == nil {
		return nil, apierrors.NewNotFound(v1alpha1.SchemeGroupVersion.WithResource("clusterapinodeclasses").GroupResource(), "")
	}
	nc := &v1alpha1.ClusterAPINodeClass{}
	if err := c.kubeClient.Get(ctx, types.NamespacedName{Name: ref.Name}, nc); err != nil {
		return nil, err
	}
	return nc, nil
}

// IsDrifted reports why the NodeClaim's Machine no longer matches what its
// NodeClass would launch now, or "" when it does.
func (c *CloudProvider) IsDrifted(ctx context.Context, nodeClaim *karpv1.NodeClaim) (cloudprovider.DriftReason, error) {
	if nodeClaim.Status.ProviderID == "" {
		return "", nil
	}
	m, err := c.machines.ByProviderID(nodeClaim.Status.ProviderID)
	if err != nil || m == nil {
		return "", err
	}
	nodeClass, err := c.nodeClass(ctx, nodeClaim.Spec.NodeClassRef)
	if err != nil {
		return "", client.IgnoreNotFound(err)
	}
	mode := c.modeFor(nodeClass)
	if mode == nil {
		return "", nil
	}
	return mode.Drifted(ctx, nodeClass, m)
}

// Reboot is not something Cluster API offers: a Machine is replaced, not restarted.
func (c *CloudProvider) Reboot(ctx context.Context, nodeClaim *karpv1.NodeClaim, operationID string) error {
	return cloudprovider.NewNodeRebootNotImplementedError()
}

// RepairAlso adds node conditions to the repair policies
// (--repair-conditions): Karpenter replaces a node once one held for its
// toleration.
func (c *CloudProvider) RepairAlso(conditions []options.RepairCondition) {
	for _, rc := range conditions {
		c.extraRepair = append(c.extraRepair, cloudprovider.RepairPolicy{
			// Any reason: core allows one policy without a reason regex
			// (the default fallback), the first Ready policy.
			ConditionType: rc.Type, ConditionStatus: rc.Status, ReasonRegex: ".*",
			TolerationDuration: rc.Toleration, Action: cloudprovider.ReplaceNode,
		})
	}
}

// RepairPolicies replaces nodes whose kubelet stopped reporting Ready, and
// those with a condition of --repair-conditions. The Ready toleration is
// longer than a MachineHealthCheck's usual timeout so that, when both watch
// the same Machines, Cluster API remediates first (see docs).
func (c *CloudProvider) RepairPolicies() []cloudprovider.RepairPolicy {
	return append([]cloudprovider.RepairPolicy{
		{ // the single default fallback of the set
			ConditionType: corev1.NodeReady, ConditionStatus: corev1.ConditionFalse,
			TolerationDuration: 30 * time.Minute, Action: cloudprovider.ReplaceNode,
		},
		{
			ConditionType: corev1.NodeReady, ConditionStatus: corev1.ConditionUnknown, ReasonRegex: ".*",
			TolerationDuration: 30 * time.Minute, Action: cloudprovider.ReplaceNode,
		},
	}, c.extraRepair...)
}

// Name of the cloud provider.
func (c *CloudProvider) Name() string { return Name }

// GetSupportedNodeClasses returns the ClusterAPINodeClass.
func (c *CloudProvider) GetSupportedNodeClasses() []status.Object {
	return []status.Object{&v1alpha1.ClusterAPINodeClass{}}
}
