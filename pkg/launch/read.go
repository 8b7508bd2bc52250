package launch

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/hub"
)

// ReadFailure reads the infrastructure machine of a Machine from the hub
// cache and reports a failed launch (see ReadLaunchFailure), with the
// infrastructure machine named in the message. An infrastructure machine
// the cache does not hold yet (or a Machine that names none yet) is no
// failure.
func ReadFailure(ctx context.Context, h *hub.Hub, m *clusterv1.Machine) (LaunchFailure, error) {
	infra, err := infraOf(ctx, h, m)
	if err != nil || infra == nil {
		return LaunchFailure{}, err
	}
	ref := m.Spec.InfrastructureRef
	f := ReadLaunchFailure(infra)
	if f.Failed {
		f.Message = fmt.Sprintf("%s %s/%s: %s", ref.Kind, m.Namespace, ref.Name, f.Message)
	}
	return f, nil
}

// ProviderIDOf returns the providerID of the Machine's instance: the
// Machine's own or, before Cluster API copies it (it does so only once the
// infrastructure machine is provisioned, after the instance booted), the
// infrastructure machine's spec.providerID, read from the hub cache. CAPA
// sets that right after RunInstances, as the AWS provider's launch returns
// after CreateFleet: Karpenter plans its next pods only once every launch
// it started has returned a providerID, so a launch that waited for the
// boot held every later pod back by the boot and Cluster API's copy. ""
// while neither has one.
func ProviderIDOf(ctx context.Context, h *hub.Hub, m *clusterv1.Machine) (string, error) {
	if m.Spec.ProviderID != "" {
		return m.Spec.ProviderID, nil
	}
	infra, err := infraOf(ctx, h, m)
	if err != nil || infra == nil {
		return "", err
	}
	id, _, _ := unstructured.NestedString(infra.Object, "spec", "providerID")
	return id, nil
}

// infraOf reads the Machine's infrastructure machine from the hub cache:
// nil when the Machine names none yet or the cache does not hold it (yet).
func infraOf(ctx context.Context, h *hub.Hub, m *clusterv1.Machine) (*unstructured.Unstructured, error) {
	ref := m.Spec.InfrastructureRef
	if ref.Name == "" {
		return nil, nil
	}
	mapping, err := h.GetRESTMapper().RESTMapping(schema.GroupKind{Group: ref.APIGroup, Kind: ref.Kind})
	if err != nil {
		return nil, fmt.Errorf("Machine %s/%s: kind %s.%s is not served by the management cluster: %w", m.Namespace, m.Name, ref.Kind, ref.APIGroup, err)
	}
	infra := &unstructured.Unstructured{}
	infra.SetGroupVersionKind(mapping.GroupVersionKind)
	if err := h.GetCache().Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: ref.Name}, infra); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading %s %s/%s: %w", ref.Kind, m.Namespace, ref.Name, err)
	}
	return infra, nil
}
