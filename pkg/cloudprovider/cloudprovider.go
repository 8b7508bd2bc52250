// Package cloudprovider implements Karpenter's CloudProvider for Cluster API.
// It orchestrates; the Cluster API plumbing lives in the mode packages.
package cloudprovider

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/awslabs/operatorpkg/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/scheduling"
	"sigs.k8s.io/karpenter/pkg/utils/resources"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/kubelet"
	"github.com/autonode/karpenter-clusterapi/pkg/machine"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
	"github.com/autonode/karpenter-clusterapi/pkg/operator/options"
)

// Name of this cloud provider, as Karpenter reports it.
const Name = "clusterapi"

// CloudProvider turns NodeClaims into Cluster API objects and back.
type CloudProvider struct {
	kubeClient client.Client // the workload cluster
	store      *instancetype.Store
	managed    *hub.ManagedMachines
	machines   *hub.Lookup
	md         *machinedeployment.Provider
	mm         *machine.Provider
	// priced returns the instance types with the prices Karpenter uses
	// (NodeOverlays applied); Create picks the cheapest by those.
	priced cloudprovider.CloudProvider
	// hubBack waits until an unreachable hub answers again (nil: no waiting).
	hubBack func(context.Context) error
	// extraRepair are the repair policies of --repair-conditions.
	extraRepair []cloudprovider.RepairPolicy
}

// WaitForHubWith makes Create wait out an unreachable hub, up to
// hubOutageWait, rather than fail at once: core backs off a failed launch
// by up to a minute, so a pending pod would wait that long after the hub's
// return. wait returns once the hub answers (hub.Reachability.Wait).
func (c *CloudProvider) WaitForHubWith(wait func(context.Context) error) { c.hubBack = wait }

// hubOutageWait bounds how long one Create waits for an unreachable hub, like
// the wait for a Machine's providerID: core's launch worker is blocked meanwhile.
const hubOutageWait = machinedeployment.DefaultLaunchWait

// UsePricesFrom makes Create choose offerings by the prices p reports, the
// decorated provider core schedules with, so that NodeOverlay price changes
// decide launches too.
func (c *CloudProvider) UsePricesFrom(p cloudprovider.CloudProvider) { c.priced = p }

var _ cloudprovider.CloudProvider = (*CloudProvider)(nil)

// New returns the cloud provider: md serves MachineDeployment mode and mm
// Machine mode.
func New(kubeClient client.Client, store *instancetype.Store, managed *hub.ManagedMachines, machines *hub.Lookup,
	md *machinedeployment.Provider, mm *machine.Provider) *CloudProvider {
	return &CloudProvider{kubeClient: kubeClient, store: store, managed: managed, machines: machines, md: md, mm: mm}
}

// Create launches a Machine for the NodeClaim and returns the NodeClaim
// with its providerID, labels and resources, once the Machine has one.
func (c *CloudProvider) Create(ctx context.Context, nodeClaim *karpv1.NodeClaim) (*karpv1.NodeClaim, error) {
	nodeClass, err := c.nodeClass(ctx, nodeClaim.Spec.NodeClassRef)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, cloudprovider.NewInsufficientCapacityError(fmt.Errorf("resolving NodeClass of NodeClaim %s: %w", nodeClaim.Name, err))
		}
		return nil, fmt.Errorf("resolving NodeClass of NodeClaim %s: %w", nodeClaim.Name, err)
	}
	if ready := nodeClass.StatusConditions().Get(status.ConditionReady); ready.IsFalse() {
		return nil, cloudprovider.NewNodeClassNotReadyError(fmt.Errorf("ClusterAPINodeClass %s: %s", nodeClass.Name, ready.Message))
	}
	if nodeClass.Spec.MachineTemplate != nil {
		return c.createMachine(ctx, nodeClass, nodeClaim)
	}
	set, err := c.resolve(ctx, nodeClass)
	if err != nil {
		return nil, err
	}
	if nodeClaim.Annotations == nil {
		nodeClaim.Annotations = map[string]string{}
	}
	record := func(md types.NamespacedName) {
		// Core persists this even when Create fails.
		nodeClaim.Annotations[v1alpha1.MachineDeploymentAnnotation] = md.String()
	}
	var chosen *instancetype.Source
	launch := func() (*clusterv1.Machine, error) {
		var earlier *types.NamespacedName
		if ref := nodeClaim.Annotations[v1alpha1.MachineDeploymentAnnotation]; ref != "" {
			ns, name, ok := strings.Cut(ref, "/")
			if !ok || ns == "" || name == "" {
				return nil, fmt.Errorf("NodeClaim %s: annotation %s %q is not <namespace>/<name>", nodeClaim.Name, v1alpha1.MachineDeploymentAnnotation, ref)
			}
			earlier = &types.NamespacedName{Namespace: ns, Name: name}
		}
		return c.md.Launch(ctx, nodeClaim.Name, earlier, record, func() (instancetype.Source, error) {
			src, err := cheapest(set, c.pricedInstanceTypes(ctx, nodeClaim, set), nodeClaim)
			if err != nil {
				return instancetype.Source{}, err
			}
			chosen = &src
			return src, nil
		})
	}
	m, err := c.throughHubOutage(ctx, launch)
	if err != nil {
		if errors.Is(err, machinedeployment.ErrStillLaunching) {
			return nil, cloudprovider.NewCreateError(err, "MachineLaunching", truncate(err.Error()))
		}
		return nil, err
	}
	// Record the binding on the NodeClaim: core persists it even when a
	// later step fails, and Delete finds the Machine by it.
	nodeClaim.Annotations[v1alpha1.MachineAnnotation] = m.Namespace + "/" + m.Name
	created := c.toNodeClaim(m)
	if chosen != nil && created.Labels[corev1.LabelInstanceTypeStable] == "" {
		fillFromSource(created, *chosen, m)
	}
	// The set carries the NodeClass's spec.kubelet, the store does not:
	// promise the capacity and allocatable Karpenter planned with.
	if src, ok := set.Source(types.NamespacedName{Namespace: m.Namespace, Name: m.Labels[clusterv1.MachineDeploymentNameLabel]}); ok {
		fillFromSource(created, src, m)
	}
	// Core keeps what Create returns: give it its own copy of what the
	// store shares.
	created = created.DeepCopy()
	created.Annotations = map[string]string{
		v1alpha1.MachineAnnotation:           nodeClaim.Annotations[v1alpha1.MachineAnnotation],
		v1alpha1.MachineDeploymentAnnotation: nodeClaim.Annotations[v1alpha1.MachineDeploymentAnnotation],
	}
	if created.Annotations[v1alpha1.MachineDeploymentAnnotation] == "" {
		delete(created.Annotations, v1alpha1.MachineDeploymentAnnotation)
	}
	return created, nil
}

// throughHubOutage runs launch, and again each time the hub answers after
// launch failed because it was unreachable, for up to hubOutageWait. A
// launch resumes from what the earlier attempts recorded.
func (c *CloudProvider) throughHubOutage(ctx context.Context, launch func() (*clusterv1.Machine, error)) (*clusterv1.Machine, error) {
	m, err := launch()
	if c.hubBack == nil || !hub.Unreachable(err) {
		return m, err
	}
	wctx, cancel := context.WithTimeout(ctx, hubOutageWait)
	defer cancel()
	for hub.Unreachable(err) {
		if c.hubBack(wctx) != nil {
			return nil, err // still unreachable: core retries later
		}
		m, err = launch()
	}
	return m, err
}

// pricedInstanceTypes returns the instance types with the prices core
// schedules with (NodeOverlays applied), or the set's own when unavailable.
func (c *CloudProvider) pricedInstanceTypes(ctx context.Context, nodeClaim *karpv1.NodeClaim, set *instancetype.Set) []*cloudprovider.InstanceType {
	name := nodeClaim.Labels[karpv1.NodePoolLabelKey]
	if c.priced == nil || name == "" {
		return set.InstanceTypes
	}
	np := &karpv1.NodePool{}
	if err := c.kubeClient.Get(ctx, types.NamespacedName{Name: name}, np); err != nil {
		return set.InstanceTypes
	}
	its, err := c.priced.GetInstanceTypes(ctx, np)
	if err != nil || len(its) == 0 {
		return set.InstanceTypes
	}
	return its
}

// cheapest picks the cheapest available offering compatible with the
// NodeClaim's requirements and resources, by the prices of its, and the
// object of the set to launch it from.
func cheapest(set *instancetype.Set, its []*cloudprovider.InstanceType, nodeClaim *karpv1.NodeClaim) (instancetype.Source, error) {
	reqs := scheduling.NewNodeSelectorRequirementsWithMinValues(nodeClaim.Spec.Requirements...)
	var best *instancetype.Source
	bestPrice := 0.0
	var why []string
	for _, it := range its {
		if err := it.Requirements.Intersects(reqs); err != nil {
			if reqs.Get(corev1.LabelInstanceTypeStable).Has(it.Name) {
				why = append(why, fmt.Sprintf("%s: %v", it.Name, err))
			}
			continue
		}
		if !resources.Fits(nodeClaim.Spec.Resources.Requests, it.Allocatable()) {
			why = append(why, fmt.Sprintf("%s: requests %v do not fit allocatable %v", it.Name, resources.String(nodeClaim.Spec.Resources.Requests), resources.String(it.Allocatable())))
			continue
		}
		compatible := it.Offerings.Available().Compatible(reqs)
		if len(compatible) == 0 {
			why = append(why, fmt.Sprintf("%s: no available offering matches %s", it.Name, offeringRequirements(reqs)))
		}
		for _, of := range compatible {
			key := instancetype.KeyOf(it.Name, of)
			found := false
			for _, src := range set.Origins[key] {
				if !src.Available {
					continue
				}
				found = true
				if best == nil || of.Price < bestPrice {
					s := src
					best, bestPrice = &s, of.Price
				}
				break
			}
			if !found {
				why = append(why, fmt.Sprintf("%s in %s (%s): unavailable", it.Name, zoneName(key.Zone), key.CapacityType))
			}
		}
	}
	if best == nil {
		return instancetype.Source{}, cloudprovider.NewInsufficientCapacityError(fmt.Errorf("NodeClaim %s: no available offering fits its requirements and resources: %s",
			nodeClaim.Name, truncate(strings.Join(why, "; "))))
	}
	return *best, nil
}

// zoneName names a zone in messages; an offering without one is in no
// particular zone (the infrastructure chooses).
func zoneName(zone string) string {
	if zone == "" {
		return "no particular zone"
	}
	return "zone " + zone
}

func offeringRequirements(reqs scheduling.Requirements) string {
	var parts []string
	for _, key := range []string{corev1.LabelTopologyZone, karpv1.CapacityTypeLabelKey} {
		if reqs.Has(key) {
			parts = append(parts, reqs.Get(key).String())
		}
	}
	if len(parts) == 0 {
		return "any zone and capacity type"
	}
	return strings.Join(parts, ", ")
}

// Delete removes the NodeClaim's Machine. It returns NodeClaimNotFoundError
// once the Machine is gone.
func (c *CloudProvider) Delete(ctx context.Context, nodeClaim *karpv1.NodeClaim) error {
	var ref *types.NamespacedName
	if v := nodeClaim.Annotations[v1alpha1.MachineAnnotation]; v != "" {
		ns, name, ok := strings.Cut(v, "/")
		if !ok || ns == "" || name == "" {
			return fmt.Errorf("NodeClaim %s: annotation %s %q is not <namespace>/<name>", nodeClaim.Name, v1alpha1.MachineAnnotation, v)
		}
		ref = &types.NamespacedName{Namespace: ns, Name: name}
	}
	m, err := c.machines.Find(ctx, nodeClaim.Name, ref, nodeClaim.Status.ProviderID)
	if err != nil {
		return err
	}
	if m != nil && m.Labels[clusterv1.MachineDeploymentNameLabel] == "" && m.Annotations[v1alpha1.OfferingAnnotation] != "" {
		err = c.mm.Delete(ctx, nodeClaim.Name, m)
	} else {
		err = c.md.Release(ctx, nodeClaim.Name, m)
	}
	if errors.Is(err, machinedeployment.ErrMachineGone) || errors.Is(err, machine.ErrMachineGone) {
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
	return c.toNodeClaim(m), nil
}

// List returns a NodeClaim for every Karpenter-managed Machine with a providerID.
func (c *CloudProvider) List(ctx context.Context) ([]*karpv1.NodeClaim, error) {
	out := make([]*karpv1.NodeClaim, 0, c.managed.Len())
	if err := c.managed.List(func(m *clusterv1.Machine) {
		out = append(out, c.toNodeClaim(m))
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
	if nodeClass.Spec.MachineTemplate != nil {
		resolved, err := c.mm.Catalogue().Resolve(ctx, nodeClass)
		if err != nil {
			return nil, err
		}
		return resolved.Set.InstanceTypes, nil
	}
	if nodeClass.Spec.ScalableResourceSelector == nil {
		return nil, nil
	}
	set, err := c.resolve(ctx, nodeClass)
	if err != nil {
		return nil, err
	}
	return set.InstanceTypes, nil
}

func (c *CloudProvider) resolve(ctx context.Context, nodeClass *v1alpha1.ClusterAPINodeClass) (*instancetype.Set, error) {
	if err := c.store.Prime(ctx); err != nil {
		return nil, err
	}
	sel, err := metav1.LabelSelectorAsSelector(nodeClass.Spec.ScalableResourceSelector)
	if err != nil {
		return nil, fmt.Errorf("ClusterAPINodeClass %s: spec.scalableResourceSelector: %w", nodeClass.Name, err)
	}
	// Bad spec.kubelet values fall back; the NodeClass status reports them.
	kubeletConfig, _ := kubelet.FromNodeClass(nodeClass.Spec.Kubelet)
	return c.store.ResolveKubelet(sel, kubeletConfig, sel.String()), nil
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
	if nodeClass.Spec.MachineTemplate != nil {
		return c.mm.Drifted(ctx, nodeClass, m)
	}
	return c.machineDeploymentDrifted(ctx, nodeClass, m)
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

// toNodeClaim describes a Machine as a NodeClaim, with the labels and
// resources of the instance type its MachineDeployment yields. Labels and
// resources are shared with the store: callers must not modify them (core's
// Get and List callers only read).
func (c *CloudProvider) toNodeClaim(m *clusterv1.Machine) *karpv1.NodeClaim {
	nc := &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:              m.Annotations[v1alpha1.NodeClaimAnnotation],
			CreationTimestamp: m.CreationTimestamp,
		},
		Status: karpv1.NodeClaimStatus{ProviderID: m.Spec.ProviderID},
	}
	if !m.DeletionTimestamp.IsZero() {
		nc.DeletionTimestamp = m.DeletionTimestamp
	}
	if md := m.Labels[clusterv1.MachineDeploymentNameLabel]; md != "" {
		if src, ok := c.store.Get(types.NamespacedName{Namespace: m.Namespace, Name: md}); ok && src.Err == nil {
			fillFromSource(nc, src, m)
		}
	} else if o, err := machine.ParseOffering(m.Annotations[v1alpha1.OfferingAnnotation]); err == nil {
		if src, ok := c.mm.Catalogue().Source(o); ok {
			fillFromSource(nc, src, m)
		} else {
			// Not resolved since the start: what the Machine itself says.
			nc.Labels = map[string]string{
				corev1.LabelInstanceTypeStable: m.Annotations[v1alpha1.InstanceTypeAnnotation],
				karpv1.CapacityTypeLabelKey:    o.CapacityType,
			}
			if o.Zone != "" {
				nc.Labels[corev1.LabelTopologyZone] = o.Zone
			}
		}
	}
	return nc
}

func fillFromSource(nc *karpv1.NodeClaim, src instancetype.Source, m *clusterv1.Machine) {
	nc.Labels = src.Labels
	if zone := m.Spec.FailureDomain; zone != "" && zone != src.Zone {
		nc.Labels = maps.Clone(src.Labels)
		nc.Labels[corev1.LabelTopologyZone] = zone
	}
	nc.Status.Capacity = src.Capacity
	nc.Status.Allocatable = src.Allocatable
}

func truncate(s string) string {
	if len(s) > 1000 {
		return s[:997] + "..."
	}
	return s
}
