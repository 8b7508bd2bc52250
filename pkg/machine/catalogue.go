// Package machine implements Machine mode: each NodeClaim becomes a
// standalone Machine cloned from a Karpenter-eligible infrastructure
// template, with a bootstrap config from the NodeClass's bootstrap template
// (or a ready-made data Secret).
package machine

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/kubelet"
	"github.com/autonode/karpenter-clusterapi/pkg/launch"
)

// Catalogue resolves a Machine-mode NodeClass to instance types: one per
// eligible template, with an offering per failure domain of the Cluster and
// capacity type. Results are memoized until a template, a Cluster or the
// set of unavailable offerings changes, so GetInstanceTypes on every
// scheduling pass costs a lookup.
type Catalogue struct {
	hub         *hub.Hub
	unavailable *launch.Unavailable
	notify      func()
	// reservations counts the capacity reservation slots Machines hold.
	reservations *Reservations

	kinds           sync.Map // schema.GroupVersionKind -> *atomic.Int64 (event count)
	clustersVersion atomic.Int64
	// controlPlaneKinds are the control plane kinds watched; the version
	// counts the changes of the version a control plane runs.
	controlPlaneKinds    sync.Map // schema.GroupVersionKind -> bool
	controlPlanesVersion atomic.Int64
	// zones are the infrastructure's known zones (UseZones; nil: none).
	zones *instancetype.Zones

	mu   sync.Mutex
	memo map[string]memo
	// launched holds the latest Source of every offering resolved, by
	// Offering, so that Get and List describe Machines without resolving.
	launched map[Offering]instancetype.Source
}

type memo struct {
	key      string
	resolved *Resolved
}

// UseZones gives templates offered in no particular zone (a Cluster without
// failure domains) price records in these zones (instancetype.Zones). Call
// it before the catalogue is used.
func (c *Catalogue) UseZones(z *instancetype.Zones) {
	c.zones = z
	if c.notify != nil {
		z.OnChange(c.notify)
	}
}

// Resolved is what a NodeClass resolves to in Machine mode.
type Resolved struct {
	Set *instancetype.Set
	// Template is the version-resolved kind of the infrastructure templates.
	Template schema.GroupVersionKind
	// DriftHash changes whenever what a launch copies changes: the eligible
	// templates' specs, the bootstrap settings and bootstrap template.
	DriftHash string
}

// NewCatalogue returns a catalogue reading templates and Clusters from the
// hub cache. notify is called when something it resolves from changed.
func NewCatalogue(ctx context.Context, h *hub.Hub, unavailable *launch.Unavailable, notify func()) (*Catalogue, error) {
	c := &Catalogue{hub: h, unavailable: unavailable, notify: notify, memo: map[string]memo{}, launched: map[Offering]instancetype.Source{}}
	informer, err := h.GetCache().GetInformer(ctx, &clusterv1.Cluster{}, cache.BlockUntilSynced(false))
	if err != nil {
		return nil, fmt.Errorf("getting the Cluster informer: %w", err)
	}
	// Cluster API updates a Cluster's status often; only its failure
	// domains, what its version comes from (and its existence) change what
	// the catalogue resolves.
	handler := c.counter(&c.clustersVersion)
	bump := handler.AddFunc
	handler.UpdateFunc = func(oldObj, newObj any) {
		o, ok1 := oldObj.(*clusterv1.Cluster)
		n, ok2 := newObj.(*clusterv1.Cluster)
		if !ok1 || !ok2 || !slices.Equal(failureDomains(o), failureDomains(n)) || clusterVersionInputs(o, n) {
			bump(newObj)
		}
	}
	if _, err := informer.AddEventHandler(handler); err != nil {
		return nil, fmt.Errorf("watching Clusters: %w", err)
	}
	c.reservations = NewReservations(notify)
	machines, err := h.GetCache().GetInformer(ctx, &clusterv1.Machine{}, cache.BlockUntilSynced(false))
	if err != nil {
		return nil, fmt.Errorf("getting the Machine informer: %w", err)
	}
	if _, err := machines.AddEventHandler(c.reservations.handler()); err != nil {
		return nil, fmt.Errorf("watching Machines: %w", err)
	}
	return c, nil
}

func (c *Catalogue) counter(v *atomic.Int64) toolscache.ResourceEventHandlerFuncs {
	bump := func(any) {
		v.Add(1)
		if c.notify != nil {
			c.notify()
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    bump,
		UpdateFunc: func(_, o any) { bump(o) },
		DeleteFunc: bump,
	}
}

// watchKind makes sure the hub cache watches the kind, and returns its
// event counter.
func (c *Catalogue) watchKind(ctx context.Context, gvk schema.GroupVersionKind) (*atomic.Int64, error) {
	if v, ok := c.kinds.Load(gvk); ok {
		return v.(*atomic.Int64), nil
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	informer, err := c.hub.GetCache().GetInformer(ctx, u, cache.BlockUntilSynced(true))
	if err != nil {
		return nil, fmt.Errorf("watching %s: %w", gvk.Kind, err)
	}
	v := &atomic.Int64{}
	actual, loaded := c.kinds.LoadOrStore(gvk, v)
	if !loaded {
		if _, err := informer.AddEventHandler(c.counter(v)); err != nil {
			c.kinds.Delete(gvk)
			return nil, fmt.Errorf("watching %s: %w", gvk.Kind, err)
		}
	}
	return actual.(*atomic.Int64), nil
}

// ResolveKind finds the served version of a referenced kind, the way
// Cluster API references are resolved (by group and kind).
func ResolveKind(h *hub.Hub, group, kind string) (schema.GroupVersionKind, error) {
	mapping, err := h.GetRESTMapper().RESTMapping(schema.GroupKind{Group: group, Kind: kind})
	if err != nil {
		return schema.GroupVersionKind{}, fmt.Errorf("kind %s.%s is not served by the management cluster: %w", kind, group, err)
	}
	return mapping.GroupVersionKind, nil
}

// Resolve returns the instance types of a Machine-mode NodeClass. The
// result is shared: callers must not modify it.
func (c *Catalogue) Resolve(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass) (*Resolved, error) {
	mt := nc.Spec.MachineTemplate
	if mt == nil {
		return nil, fmt.Errorf("ClusterAPINodeClass %s has no spec.machineTemplate", nc.Name)
	}
	gvk, err := ResolveKind(c.hub, mt.InfrastructureTemplates.APIGroup, mt.InfrastructureTemplates.Kind)
	if err != nil {
		return nil, fmt.Errorf("ClusterAPINodeClass %s: spec.machineTemplate.infrastructureTemplates: %w", nc.Name, err)
	}
	sel, err := metav1.LabelSelectorAsSelector(&mt.InfrastructureTemplates.Selector)
	if err != nil {
		return nil, fmt.Errorf("ClusterAPINodeClass %s: spec.machineTemplate.infrastructureTemplates.selector: %w", nc.Name, err)
	}
	events, err := c.watchKind(ctx, gvk)
	if err != nil {
		return nil, err
	}
	var bootstrapGVK schema.GroupVersionKind
	var bootstrapEvents int64
	if ref := mt.Bootstrap.ConfigRef; ref != nil {
		if bootstrapGVK, err = ResolveKind(c.hub, ref.APIGroup, ref.Kind); err != nil {
			return nil, fmt.Errorf("ClusterAPINodeClass %s: spec.machineTemplate.bootstrap.configRef: %w", nc.Name, err)
		}
		counter, err := c.watchKind(ctx, bootstrapGVK)
		if err != nil {
			return nil, err
		}
		bootstrapEvents = counter.Load()
	}
	spec, _ := json.Marshal(nc.Spec)
	key := fmt.Sprintf("%s|%s|%d|%d|%d|%d|%d|%d|%d", spec, gvk, events.Load(), bootstrapEvents, c.clustersVersion.Load(), c.controlPlanesVersion.Load(),
		c.unavailable.Version(), c.reservations.Version(), c.zones.Version())
	c.mu.Lock()
	if m, ok := c.memo[nc.Name]; ok && m.key == key {
		c.mu.Unlock()
		return m.resolved, nil
	}
	c.mu.Unlock()

	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	opts := append(c.hub.Scope.NamespaceListOptions(), client.MatchingLabelsSelector{Selector: hub.HasLabel(sel, v1alpha1.KarpenterMemberLabel)})
	if err := c.hub.GetCache().List(ctx, list, opts...); err != nil {
		return nil, fmt.Errorf("listing %s: %w", gvk.Kind, err)
	}
	nodeLabels := map[string]string{}
	for k, v := range mt.Metadata.Labels {
		if instancetype.PropagatesToNode(k) {
			nodeLabels[k] = v
		}
	}
	var sources []instancetype.Source
	var problems []string
	override, errs := kubelet.FromNodeClass(nc.Spec.Kubelet)
	for _, e := range errs {
		problems = append(problems, kubelet.Problem(e))
	}
	bootstraps := map[string]*bootstrapOf{} // by namespace
	var hashes []string
	for i := range list.Items {
		t := &list.Items[i]
		cluster, inScope, err := c.clusterOf(ctx, t)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		if !inScope {
			continue
		}
		b, ok := bootstraps[t.GetNamespace()]
		if !ok {
			b = c.bootstrap(ctx, mt, bootstrapGVK, t.GetNamespace())
			bootstraps[t.GetNamespace()] = b
			problems = append(problems, b.problems...)
			hashes = append(hashes, t.GetNamespace()+"|bootstrap="+BootstrapHash(mt, b.template))
		}
		hashes = append(hashes, t.GetNamespace()+"/"+t.GetName()+"="+TemplateHash(t))
		if mt.Version == "" {
			// The version new Machines get follows the control plane: a
			// Kubernetes upgrade changes the hash, so Karpenter checks drift
			// at once (the memo key counts the control planes' version
			// changes, see controlplane.go).
			// Unwatched (its kind is not served), a change is seen by
			// Karpenter's periodic drift check; the launch says what is wrong.
			_ = c.watchControlPlane(ctx, cluster)
			v, err := runningVersion(ctx, c.hub, cluster)
			if err != nil {
				v = "unknown" // launches say why; the hash must not stop the resolution
			}
			hashes = append(hashes, t.GetNamespace()+"/"+t.GetName()+"|version="+v)
		}
		for _, s := range instancetype.FromTemplate(t, instancetype.TemplateOptions{
			ClusterName: cluster.Name,
			Zones:       failureDomains(cluster),
			SpotCapable: spotCapable(gvk),
			NodeLabels:  nodeLabels,
			Kubelet:     b.kubelet,
		}) {
			s = s.WithKubelet(override)
			if s.Err == nil && s.ReservationID != "" {
				s.ReservationCapacity = max(0, s.ReservationCount-c.reservations.Used(s.ReservationID))
			}
			if s.Err == nil && c.unavailable.Has(instancetype.OfferingKey{InstanceType: s.Name, Zone: s.Zone, CapacityType: s.CapacityType}) {
				s.Available = false
			}
			sources = append(sources, s)
		}
	}
	set := instancetype.Build(sources, c.zones.List()...)
	set.Problems = append(problems, set.Problems...)
	sort.Strings(hashes)
	resolved := &Resolved{Set: set, Template: gvk, DriftHash: hashOf(hashes)}
	c.mu.Lock()
	c.memo[nc.Name] = memo{key: key, resolved: resolved}
	for _, list := range set.Origins {
		for _, s := range list {
			c.launched[Offering{Template: s.Origin, Zone: s.Zone, CapacityType: s.CapacityType}] = s
		}
	}
	c.mu.Unlock()
	return resolved, nil
}

// Source returns the latest resolved Source of an offering. Its maps are
// shared: callers must not modify them.
func (c *Catalogue) Source(o Offering) (instancetype.Source, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.launched[o]
	return s, ok
}

// bootstrapOf is a NodeClass's bootstrap template in one namespace and the
// kubelet settings it gives nodes.
type bootstrapOf struct {
	template *unstructured.Unstructured
	kubelet  kubelet.Config
	problems []string
}

// bootstrap reads the NodeClass's bootstrap template in a namespace. A
// missing template is reported by the NodeClass status (and fails launches);
// here it only means no kubelet settings.
func (c *Catalogue) bootstrap(ctx context.Context, mt *v1alpha1.MachineTemplate, gvk schema.GroupVersionKind, namespace string) *bootstrapOf {
	out := &bootstrapOf{}
	ref := mt.Bootstrap.ConfigRef
	if ref == nil {
		return out
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	if err := c.hub.GetCache().Get(ctx, types.NamespacedName{Namespace: namespace, Name: ref.Name}, u); err != nil {
		return out
	}
	out.template = u
	if gvk.Group == "bootstrap.cluster.x-k8s.io" && gvk.Kind == "KubeadmConfigTemplate" {
		cfg, errs := kubelet.FromKubeadmConfigTemplate(u)
		out.kubelet = cfg
		for _, e := range errs {
			out.problems = append(out.problems, fmt.Sprintf("%s %s/%s: %s", ref.Kind, namespace, ref.Name, kubelet.Problem(e)))
		}
	}
	return out
}

// Unavailable returns the offerings of a resolved NodeClass that are left
// out of launches after a capacity failure.
func (c *Catalogue) Unavailable(r *Resolved) []v1alpha1.UnavailableOffering {
	names := make(map[string]bool, len(r.Set.InstanceTypes))
	for _, it := range r.Set.InstanceTypes {
		names[it.Name] = true
	}
	return c.unavailable.For(names)
}

// Forget drops the memo of a deleted NodeClass.
func (c *Catalogue) Forget(nodeClass string) {
	c.mu.Lock()
	delete(c.memo, nodeClass)
	c.mu.Unlock()
}

// clusterOf finds the Cluster whose Machines a template launches: the
// scope's Cluster, else the template's cluster-name label, else the only
// Cluster in its namespace. inScope is false for a template labelled for
// another Cluster than the scope's.
func (c *Catalogue) clusterOf(ctx context.Context, t *unstructured.Unstructured) (*clusterv1.Cluster, bool, error) {
	what := fmt.Sprintf("%s %s/%s", t.GetKind(), t.GetNamespace(), t.GetName())
	name := t.GetLabels()[clusterv1.ClusterNameLabel]
	if scoped := c.hub.Scope.ClusterName; scoped != "" {
		if name != "" && name != scoped {
			return nil, false, nil
		}
		name = scoped
	}
	cluster := &clusterv1.Cluster{}
	if name == "" {
		list := &clusterv1.ClusterList{}
		if err := c.hub.GetCache().List(ctx, list, client.InNamespace(t.GetNamespace())); err != nil {
			return nil, false, fmt.Errorf("%s: listing Clusters: %w", what, err)
		}
		if len(list.Items) != 1 {
			return nil, false, fmt.Errorf("%s: cannot tell which Cluster its Machines join (%d Clusters in namespace %s): label it %s=<cluster> or run with --cluster-api-cluster-name",
				what, len(list.Items), t.GetNamespace(), clusterv1.ClusterNameLabel)
		}
		return &list.Items[0], true, nil
	}
	if err := c.hub.GetCache().Get(ctx, types.NamespacedName{Namespace: t.GetNamespace(), Name: name}, cluster); err != nil {
		return nil, false, fmt.Errorf("%s: reading Cluster %s/%s: %w", what, t.GetNamespace(), name, err)
	}
	return cluster, true, nil
}

// failureDomains are the Cluster's failure domains, sorted.
func failureDomains(c *clusterv1.Cluster) []string {
	out := make([]string, 0, len(c.Status.FailureDomains))
	for _, fd := range c.Status.FailureDomains {
		out = append(out, fd.Name)
	}
	sort.Strings(out)
	return out
}

// spotCapable reports whether a Machine cloned from templates of this kind
// can be made spot: CAPA's AWSMachine has spec.spotMarketOptions.
func spotCapable(gvk schema.GroupVersionKind) bool {
	return gvk.Group == "infrastructure.cluster.x-k8s.io" && gvk.Kind == "AWSMachineTemplate"
}

// machineKind is the kind a template of this kind clones into.
func machineKind(templateKind string) string {
	return strings.TrimSuffix(templateKind, "Template")
}
