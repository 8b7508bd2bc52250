// Package nodeclass resolves a ClusterAPINodeClass to the Cluster API
// objects it selects in the hub.
package nodeclass

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	nodeclassstatus "github.com/autonode/karpenter-clusterapi/pkg/controllers/nodeclass/status"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/kubelet"
	"github.com/autonode/karpenter-clusterapi/pkg/machine"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
	"github.com/autonode/karpenter-clusterapi/pkg/metrics"
)

// Resolver resolves NodeClasses against the hub.
type Resolver struct {
	hub       *hub.Hub
	store     *instancetype.Store
	catalogue *machine.Catalogue

	mu         sync.Mutex
	lastPrices map[string][]prometheus.Labels // per NodeClass, the price series it set
}

// recordPrices publishes the price of every offering of the NodeClass and
// removes series of offerings that went away.
func (r *Resolver) recordPrices(nodeClass string, set *instancetype.Set) {
	var series []prometheus.Labels
	for _, it := range set.InstanceTypes {
		for _, of := range it.Offerings {
			key := instancetype.KeyOf(it.Name, of)
			estimated := false
			origins := set.Origins[key]
			if len(origins) == 0 {
				// A price record (instancetype.Zones) has the zoneless offering's price.
				origins = set.Origins[instancetype.OfferingKey{InstanceType: key.InstanceType, CapacityType: key.CapacityType}]
			}
			for _, src := range origins {
				if src.Price == of.Price {
					estimated = src.PriceEstimated
					break
				}
			}
			// An offering without a zone is labelled zone="" (never a
			// random value: the series stay bounded).
			l := prometheus.Labels{"nodeclass": nodeClass, "instance_type": it.Name, "zone": key.Zone,
				"capacity_type": key.CapacityType, "estimated": strconv.FormatBool(estimated)}
			metrics.OfferingPrice.With(l).Set(of.Price)
			series = append(series, l)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lastPrices == nil {
		r.lastPrices = map[string][]prometheus.Labels{}
	}
	for _, old := range r.lastPrices[nodeClass] {
		if !containsLabels(series, old) {
			metrics.OfferingPrice.Delete(old)
		}
	}
	r.lastPrices[nodeClass] = series
}

func containsLabels(list []prometheus.Labels, l prometheus.Labels) bool {
	for _, x := range list {
		if maps.Equal(x, l) {
			return true
		}
	}
	return false
}

// NewResolver returns a resolver reading from the hub: MachineDeployments
// through the instance-type store, templates through the catalogue.
func NewResolver(h *hub.Hub, store *instancetype.Store, catalogue *machine.Catalogue) *Resolver {
	return &Resolver{hub: h, store: store, catalogue: catalogue}
}

var _ nodeclassstatus.Resolver = (*Resolver)(nil)

// Resolve returns the instance types the NodeClass selects.
func (r *Resolver) Resolve(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass) (nodeclassstatus.Resolution, error) {
	switch {
	case nc.Spec.ScalableResourceSelector != nil:
		return r.resolveMachineDeployments(ctx, nc)
	case nc.Spec.MachineTemplate != nil:
		return r.resolveTemplates(ctx, nc)
	}
	return nodeclassstatus.Resolution{}, fmt.Errorf("neither spec.scalableResourceSelector nor spec.machineTemplate is set")
}

func (r *Resolver) resolveMachineDeployments(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass) (nodeclassstatus.Resolution, error) {
	if err := r.store.Prime(ctx); err != nil {
		return nodeclassstatus.Resolution{}, nodeclassstatus.Transient(err)
	}
	sel, err := metav1.LabelSelectorAsSelector(nc.Spec.ScalableResourceSelector)
	if err != nil {
		return nodeclassstatus.Resolution{}, fmt.Errorf("spec.scalableResourceSelector is not a valid label selector: %w", err)
	}
	kubeletConfig, kubeletErrs := kubelet.FromNodeClass(nc.Spec.Kubelet)
	set := r.store.ResolveKubelet(sel, kubeletConfig, sel.String())
	r.recordPrices(nc.Name, set)
	// A template or version change of a selected MachineDeployment changes
	// the hash: the status update makes Karpenter re-check drift at once.
	driftHash, err := machinedeployment.DriftHash(ctx, r.hub, sel)
	if err != nil {
		return nodeclassstatus.Resolution{}, nodeclassstatus.Transient(err)
	}
	res := nodeclassstatus.Resolution{Problems: set.Problems, EstimatedPrices: set.Estimated, DriftHash: driftHash}
	for _, e := range kubeletErrs {
		res.Problems = append(res.Problems, kubelet.Problem(e))
	}
	for _, it := range set.InstanceTypes {
		res.InstanceTypes = append(res.InstanceTypes, it.Name)
	}
	return res, nil
}

func (r *Resolver) resolveTemplates(ctx context.Context, nc *v1alpha1.ClusterAPINodeClass) (nodeclassstatus.Resolution, error) {
	mt := nc.Spec.MachineTemplate
	if _, err := machine.ResolveKind(r.hub, mt.InfrastructureTemplates.APIGroup, mt.InfrastructureTemplates.Kind); err != nil {
		err = fmt.Errorf("spec.machineTemplate.infrastructureTemplates: %w", err)
		if !meta.IsNoMatchError(err) {
			// Discovery failed (the hub is unreachable): no answer about the kind.
			return nodeclassstatus.Resolution{}, nodeclassstatus.Transient(err)
		}
		return nodeclassstatus.Resolution{}, err
	}
	if _, err := metav1.LabelSelectorAsSelector(&mt.InfrastructureTemplates.Selector); err != nil {
		return nodeclassstatus.Resolution{}, fmt.Errorf("spec.machineTemplate.infrastructureTemplates.selector is not a valid label selector: %w", err)
	}
	if ref := mt.Bootstrap.ConfigRef; ref != nil {
		problem, err := r.checkExists(ctx, schema.GroupKind{Group: ref.APIGroup, Kind: ref.Kind}, ref.Name, "spec.machineTemplate.bootstrap.configRef")
		if err != nil {
			return nodeclassstatus.Resolution{}, nodeclassstatus.Transient(err)
		}
		if problem != "" {
			return nodeclassstatus.Resolution{Problems: []string{problem}}, nil
		}
	}
	resolved, err := r.catalogue.Resolve(ctx, nc)
	if err != nil {
		return nodeclassstatus.Resolution{}, nodeclassstatus.Transient(err)
	}
	r.recordPrices(nc.Name, resolved.Set)
	res := nodeclassstatus.Resolution{Problems: resolved.Set.Problems, EstimatedPrices: resolved.Set.Estimated, DriftHash: resolved.DriftHash,
		Unavailable: r.catalogue.Unavailable(resolved)}
	for _, it := range resolved.Set.InstanceTypes {
		res.InstanceTypes = append(res.InstanceTypes, it.Name)
	}
	return res, nil
}

// checkExists returns a problem naming the field when the referenced object
// does not exist in the scope's namespace (or any namespace when unscoped),
// or cannot be read for lack of rights. It returns an error, not a problem,
// when the hub gives no answer (unreachable, failing): that says nothing
// about the object, and must not make the NodeClass not Ready.
func (r *Resolver) checkExists(ctx context.Context, gk schema.GroupKind, name, field string) (string, error) {
	mapping, err := r.hub.GetRESTMapper().RESTMapping(gk)
	if meta.IsNoMatchError(err) {
		return fmt.Sprintf("%s: kind %s is not served by the management cluster", field, gk), nil
	}
	if err != nil {
		return "", fmt.Errorf("%s: discovering kind %s: %w", field, gk, err)
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(mapping.GroupVersionKind.GroupVersion().WithKind(gk.Kind + "List"))
	opts := append(r.hub.Scope.NamespaceListOptions(), client.MatchingFields{"metadata.name": name})
	if err := r.hub.GetAPIReader().List(ctx, list, opts...); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
			return fmt.Sprintf("%s: cannot read %s %q: %v", field, gk.Kind, name, err), nil
		}
		return "", fmt.Errorf("%s: reading %s %q: %w", field, gk.Kind, name, err)
	}
	if len(list.Items) == 0 {
		return fmt.Sprintf("%s: %s %q does not exist", field, gk.Kind, name), nil
	}
	return "", nil
}

// instanceTypeName is the node.kubernetes.io/instance-type label the nodes
// will carry, when the labels say so.
func instanceTypeName(labels map[string]string, fallback string) string {
	if v := labels[corev1.LabelInstanceTypeStable]; v != "" {
		return v
	}
	return fallback
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

func sortedKeys(m map[string]struct{}) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
