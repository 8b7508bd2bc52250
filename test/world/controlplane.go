package world

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// The world's control plane provider is a stand-in for a managed control
// plane (EKS-like): an object of this tiny CRD whose status says, in the
// Cluster API v1beta2 control plane contract, that the control plane is
// initialized and available, externally managed (no control plane Machines
// or Nodes), at version KubeletVersion. Nothing reconciles it.
const (
	ControlPlaneGroup   = "controlplane.world.test"
	ControlPlaneVersion = "v1beta2"
	ControlPlaneKind    = "WorldControlPlane"
)

// ControlPlaneCRD returns the WorldControlPlane CRD, labelled with the
// Cluster API contract it implements (cluster.x-k8s.io/v1beta2: v1beta2).
func ControlPlaneCRD() *apiextensionsv1.CustomResourceDefinition {
	preserve := true
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "worldcontrolplanes." + ControlPlaneGroup,
			Labels: map[string]string{"cluster.x-k8s.io/v1beta2": ControlPlaneVersion},
		},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: ControlPlaneGroup,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Kind: ControlPlaneKind, ListKind: ControlPlaneKind + "List",
				Plural: "worldcontrolplanes", Singular: "worldcontrolplane",
				Categories: []string{"cluster-api"},
			},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: ControlPlaneVersion, Served: true, Storage: true,
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"apiVersion": {Type: "string"},
						"kind":       {Type: "string"},
						"metadata":   {Type: "object"},
						"spec":       {Type: "object", XPreserveUnknownFields: &preserve},
						"status":     {Type: "object", XPreserveUnknownFields: &preserve},
					},
				}},
			}},
		},
	}
}

// controlPlaneObject returns the WorldControlPlane of a cluster; status is
// written separately (subresource).
func controlPlaneObject(namespace, name, host string, port int64) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{
			"version":              KubeletVersion,
			"controlPlaneEndpoint": map[string]any{"host": host, "port": port},
		},
	}}
	u.SetAPIVersion(ControlPlaneGroup + "/" + ControlPlaneVersion)
	u.SetKind(ControlPlaneKind)
	u.SetNamespace(namespace)
	u.SetName(name)
	return u
}

// controlPlaneStatus is the v1beta2 contract status of a ready managed control plane.
func controlPlaneStatus(generation int64) map[string]any {
	now := metav1.Now().UTC().Format("2006-01-02T15:04:05Z")
	return map[string]any{
		"initialization":              map[string]any{"controlPlaneInitialized": true},
		"externalManagedControlPlane": true,
		"version":                     KubeletVersion,
		"conditions": []any{map[string]any{
			"type": "Available", "status": "True", "reason": "Available", "message": "",
			"lastTransitionTime": now, "observedGeneration": generation,
		}},
	}
}

// machinePoolCRD is Cluster API's MachinePool CRD at v1beta2: the Cluster
// controller watches MachinePools while the MachinePool feature gate is on
// (its default), so the kind must exist.
func machinePoolCRD() (*apiextensionsv1.CustomResourceDefinition, error) {
	dir, err := environment.ModuleDir("sigs.k8s.io/cluster-api")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "core", "config", "crd", "bases", "cluster.x-k8s.io_machinepools.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096).Decode(crd); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", path, err)
	}
	var kept []apiextensionsv1.CustomResourceDefinitionVersion
	for _, v := range crd.Spec.Versions {
		if v.Name == "v1beta2" {
			v.Served, v.Storage = true, true
			kept = append(kept, v)
		}
	}
	crd.Spec.Versions = kept
	crd.Spec.Conversion = nil
	return crd, nil
}
