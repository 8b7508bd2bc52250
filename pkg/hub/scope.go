// Package hub connects to the management cluster that holds the Cluster API
// objects and keeps every read and write inside the configured scope.
package hub

import (
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Scope is the part of the hub this provider may see and change: one
// namespace and one Cluster when set, everything otherwise.
type Scope struct {
	// Namespace of the Cluster; all namespaces when empty.
	Namespace string
	// ClusterName of the Cluster; all Clusters when empty.
	ClusterName string
}

// ListOptions restricts a list of namespaced Cluster API objects that carry
// the cluster-name label (Machines, MachineDeployments) to the scope, and to
// the given label selector when not nil. controller-runtime keeps only the
// last label selector of a list call, so every label condition goes here.
func (s Scope) ListOptions(selector labels.Selector) []client.ListOption {
	opts := s.NamespaceListOptions()
	if selector == nil {
		selector = labels.Everything()
	}
	if s.ClusterName != "" {
		req, err := labels.NewRequirement(clusterv1.ClusterNameLabel, selection.Equals, []string{s.ClusterName})
		if err == nil {
			selector = selector.Add(*req)
		} else {
			selector = labels.Nothing() // an invalid cluster name matches nothing
		}
	}
	if !selector.Empty() {
		opts = append(opts, client.MatchingLabelsSelector{Selector: selector})
	}
	return opts
}

// HasLabel returns selector narrowed to objects that carry the label key.
func HasLabel(selector labels.Selector, key string) labels.Selector {
	req, err := labels.NewRequirement(key, selection.Exists, nil)
	if err != nil {
		return labels.Nothing()
	}
	return selector.Add(*req)
}

// NamespaceListOptions restricts a list to the scope's namespace only, for
// objects that need not carry the cluster-name label (templates).
func (s Scope) NamespaceListOptions() []client.ListOption {
	if s.Namespace == "" {
		return nil
	}
	return []client.ListOption{client.InNamespace(s.Namespace)}
}

// Contains reports whether an object that carries the cluster-name label is
// in scope. clusterName is the object's spec.clusterName where it has one.
func (s Scope) Contains(obj client.Object, clusterName string) bool {
	if s.Namespace != "" && obj.GetNamespace() != s.Namespace {
		return false
	}
	if s.ClusterName == "" {
		return true
	}
	if obj.GetLabels()[clusterv1.ClusterNameLabel] != s.ClusterName {
		return false
	}
	return clusterName == "" || clusterName == s.ClusterName
}

// ContainsNamespace reports whether an object is in the scope's namespace.
func (s Scope) ContainsNamespace(obj client.Object) bool {
	return s.Namespace == "" || obj.GetNamespace() == s.Namespace
}

// clusterSelector selects the scope's Cluster by label, or nil when unscoped.
func (s Scope) clusterSelector() labels.Selector {
	if s.ClusterName == "" {
		return nil
	}
	return labels.SelectorFromSet(labels.Set{clusterv1.ClusterNameLabel: s.ClusterName})
}
