package machine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
)

// ObjectName is the name of the Machine, infrastructure machine and
// bootstrap config of a NodeClaim: derived from the NodeClaim so that a
// retried or resumed launch finds what an earlier attempt created, and
// prefixed with the Cluster so that two Clusters in one namespace never
// collide.
func ObjectName(clusterName, claim string) string {
	name := clusterName + "-" + claim
	if len(name) > validation.DNS1123SubdomainMaxLength {
		sum := sha256.Sum256([]byte(name))
		name = name[:validation.DNS1123SubdomainMaxLength-11] + "-" + hex.EncodeToString(sum[:])[:10]
	}
	return name
}

// Offering is the choice a launch is made from.
type Offering struct {
	Template     types.NamespacedName
	Zone         string
	CapacityType string
}

// String is the NodeClaim annotation form <ns>/<template>/<zone>/<capacity type>.
func (o Offering) String() string {
	return o.Template.Namespace + "/" + o.Template.Name + "/" + o.Zone + "/" + o.CapacityType
}

// ParseOffering parses what String returns.
func ParseOffering(s string) (Offering, error) {
	parts := strings.SplitN(s, "/", 4)
	if len(parts) != 4 || parts[0] == "" || parts[1] == "" || (parts[3] != karpv1.CapacityTypeOnDemand && parts[3] != karpv1.CapacityTypeSpot && parts[3] != karpv1.CapacityTypeReserved) {
		return Offering{}, fmt.Errorf("annotation %s %q is not <namespace>/<template>/<zone>/<capacity type>", v1alpha1.OfferingAnnotation, s)
	}
	return Offering{Template: types.NamespacedName{Namespace: parts[0], Name: parts[1]}, Zone: parts[2], CapacityType: parts[3]}, nil
}

// hashOf is a short stable hash of a JSON-able value.
func hashOf(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}

// TemplateHash is the hash of what a clone copies from a template.
func TemplateHash(t *unstructured.Unstructured) string {
	v, _, _ := unstructured.NestedFieldNoCopy(t.Object, "spec", "template")
	return hashOf(v)
}

// BootstrapHash is the hash of a NodeClass's bootstrap settings, including
// the content of its bootstrap template (nil with a data Secret).
func BootstrapHash(mt *v1alpha1.MachineTemplate, bootstrapTemplate *unstructured.Unstructured) string {
	var tmpl any
	if bootstrapTemplate != nil {
		tmpl, _, _ = unstructured.NestedFieldNoCopy(bootstrapTemplate.Object, "spec", "template")
	}
	return hashOf(struct {
		Bootstrap v1alpha1.Bootstrap
		Template  any
	}{mt.Bootstrap, tmpl})
}

// clone makes an object of kind (the template's kind minus "Template")
// from a template's spec.template, the way a MachineSet clones: labels and
// annotations of spec.template.metadata, cloned-from annotations, the
// cluster-name label; plus the provider's managed label and NodeClaim.
func clone(t *unstructured.Unstructured, gvk schema.GroupVersionKind, name, clusterName, claim string, offering Offering) (*unstructured.Unstructured, error) {
	spec, _, err := unstructured.NestedMap(t.Object, "spec", "template", "spec")
	if err != nil {
		return nil, fmt.Errorf("%s %s/%s: spec.template.spec: %w", t.GetKind(), t.GetNamespace(), t.GetName(), err)
	}
	out := &unstructured.Unstructured{Object: map[string]any{}}
	if spec != nil {
		out.Object["spec"] = spec
	}
	out.SetGroupVersionKind(gvk.GroupVersion().WithKind(machineKind(gvk.Kind)))
	out.SetNamespace(t.GetNamespace())
	out.SetName(name)
	labels, _, _ := unstructured.NestedStringMap(t.Object, "spec", "template", "metadata", "labels")
	if labels == nil {
		labels = map[string]string{}
	}
	labels[clusterv1.ClusterNameLabel] = clusterName
	labels[v1alpha1.ManagedLabel] = "true"
	out.SetLabels(labels)
	annotations, _, _ := unstructured.NestedStringMap(t.Object, "spec", "template", "metadata", "annotations")
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[clusterv1.TemplateClonedFromNameAnnotation] = t.GetName()
	annotations[clusterv1.TemplateClonedFromGroupKindAnnotation] = gvk.GroupKind().String()
	annotations[v1alpha1.NodeClaimAnnotation] = claim
	annotations[v1alpha1.OfferingAnnotation] = offering.String()
	out.SetAnnotations(annotations)
	return out, nil
}

// makeSpot turns a cloned CAPA AWSMachine into a spot request, unless the
// template already set spot market options. CAPA's webhook refuses
// spotMarketOptions beside marketType OnDemand (a template may say OnDemand
// explicitly), so the clone then asks for marketType Spot; a CapacityBlock
// machine cannot be spot at all.
func makeSpot(infra *unstructured.Unstructured) error {
	switch mt, _, _ := unstructured.NestedString(infra.Object, "spec", "marketType"); {
	case strings.EqualFold(mt, "CapacityBlock"):
		return fmt.Errorf("%s %s/%s has marketType CapacityBlock, which cannot be spot", infra.GetKind(), infra.GetNamespace(), infra.GetName())
	case mt != "":
		if err := unstructured.SetNestedField(infra.Object, "Spot", "spec", "marketType"); err != nil {
			return err
		}
	}
	if _, ok, _ := unstructured.NestedMap(infra.Object, "spec", "spotMarketOptions"); ok {
		return nil
	}
	return unstructured.SetNestedMap(infra.Object, map[string]any{}, "spec", "spotMarketOptions")
}

// dropReservation makes a cloned CAPA AWSMachine an ordinary on-demand (or
// spot) request: the reservation fields of its template are for the
// reserved offering only.
func dropReservation(infra *unstructured.Unstructured) {
	unstructured.RemoveNestedField(infra.Object, "spec", "capacityReservationId")
	if mt, _, _ := unstructured.NestedString(infra.Object, "spec", "marketType"); strings.EqualFold(mt, "CapacityBlock") {
		unstructured.RemoveNestedField(infra.Object, "spec", "marketType")
	}
	if pref, _, _ := unstructured.NestedString(infra.Object, "spec", "capacityReservationPreference"); pref == "CapacityReservationsOnly" {
		unstructured.RemoveNestedField(infra.Object, "spec", "capacityReservationPreference")
	}
}

// machineSpec is what the Machine of a launch looks like.
type machineSpec struct {
	name, clusterName, claim, version string
	instanceType                      string
	offering                          Offering
	infra                             clusterv1.ContractVersionedObjectReference
	bootstrap                         clusterv1.Bootstrap
	metadata                          v1alpha1.MachineMetadata
	templateHash, bootstrapHash       string
	// reservationID is the capacity reservation a reserved launch takes a slot of.
	reservationID string
}

func newMachine(s machineSpec) *clusterv1.Machine {
	labels := maps.Clone(s.metadata.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[clusterv1.ClusterNameLabel] = s.clusterName
	labels[v1alpha1.KarpenterMemberLabel] = ""
	annotations := maps.Clone(s.metadata.Annotations)
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[v1alpha1.NodeClaimAnnotation] = s.claim
	annotations[v1alpha1.OfferingAnnotation] = s.offering.String()
	annotations[v1alpha1.InstanceTypeAnnotation] = s.instanceType
	annotations[v1alpha1.TemplateHashAnnotation] = s.templateHash
	annotations[v1alpha1.BootstrapHashAnnotation] = s.bootstrapHash
	if s.reservationID != "" {
		annotations[v1alpha1.ReservationIDAnnotation] = s.reservationID
	}
	m := &clusterv1.Machine{}
	m.Namespace = s.offering.Template.Namespace
	m.Name = s.name
	m.Labels = labels
	m.Annotations = annotations
	m.Spec = clusterv1.MachineSpec{
		ClusterName:       s.clusterName,
		Version:           s.version,
		FailureDomain:     s.offering.Zone,
		InfrastructureRef: s.infra,
		Bootstrap:         s.bootstrap,
	}
	return m
}

// clusterVersion is the Kubernetes version new worker Machines get: the
// version the Cluster's control plane runs (its status.version), else the
// version it is asked to run (spec.version), else the Cluster's topology
// version. A worker must never be newer than the control plane (Kubernetes'
// version skew policy): during an upgrade of a managed topology the topology
// version and the control plane's spec.version move first, its status.version
// only once the control plane runs the new version, which is when the
// topology upgrades its MachineDeployments too.
func clusterVersion(ctx context.Context, c *Provider, cluster *clusterv1.Cluster) (string, error) {
	return runningVersion(ctx, c.hub, cluster)
}

// runningVersion is clusterVersion for any reader of the hub.
func runningVersion(ctx context.Context, h *hub.Hub, cluster *clusterv1.Cluster) (string, error) {
	ref := cluster.Spec.ControlPlaneRef
	if ref.Name == "" {
		return cluster.Spec.Topology.Version, nil
	}
	gvk, err := ResolveKind(h, ref.APIGroup, ref.Kind)
	if err != nil {
		return "", fmt.Errorf("Cluster %s/%s: spec.controlPlaneRef: %w", cluster.Namespace, cluster.Name, err)
	}
	cp := &unstructured.Unstructured{}
	cp.SetGroupVersionKind(gvk)
	if err := h.GetCache().Get(ctx, types.NamespacedName{Namespace: cluster.Namespace, Name: ref.Name}, cp); err != nil {
		return "", fmt.Errorf("reading the control plane %s %s/%s: %w", ref.Kind, cluster.Namespace, ref.Name, err)
	}
	return controlPlaneVersion(cp, cluster.Spec.Topology.Version), nil
}

// controlPlaneVersion is the version a control plane object runs
// (status.version), else the one it is asked to run (spec.version), else
// fallback.
func controlPlaneVersion(cp *unstructured.Unstructured, fallback string) string {
	for _, path := range [][]string{{"status", "version"}, {"spec", "version"}} {
		if v, _, _ := unstructured.NestedString(cp.Object, path...); v != "" {
			return v
		}
	}
	return fallback
}
