// Package environment starts real API servers for tests: a management
// cluster (hub) with the Cluster API and CAPA CRDs, and a workload cluster
// (spoke) with the Karpenter and NodeClass CRDs.
package environment

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	karpapis "sigs.k8s.io/karpenter/pkg/apis"
)

// clusterAPICRDs are the Cluster API CRDs the provider and the real Cluster
// API controllers use.
var clusterAPICRDs = []string{
	"cluster.x-k8s.io_clusters.yaml",
	"cluster.x-k8s.io_machines.yaml",
	"cluster.x-k8s.io_machinesets.yaml",
	"cluster.x-k8s.io_machinedeployments.yaml",
	"cluster.x-k8s.io_machinehealthchecks.yaml",
	"cluster.x-k8s.io_machinedrainrules.yaml",
}

// cabpkCRDs are the CRDs of Cluster API's kubeadm bootstrap provider
// (CABPK), which the world's simulated bootstrap provider serves.
var cabpkCRDs = []string{
	"bootstrap.cluster.x-k8s.io_kubeadmconfigs.yaml",
	"bootstrap.cluster.x-k8s.io_kubeadmconfigtemplates.yaml",
}

// capaCRDs are the CAPA CRDs of the simulated AWS.
var capaCRDs = []string{
	"infrastructure.cluster.x-k8s.io_awsclusters.yaml",
	"infrastructure.cluster.x-k8s.io_awsmachines.yaml",
	"infrastructure.cluster.x-k8s.io_awsmachinetemplates.yaml",
}

// capaControllerCRDs are the further CAPA CRDs CAPA's own controller
// manager needs (its AWSCluster session code reads the identity kinds).
var capaControllerCRDs = []string{
	"infrastructure.cluster.x-k8s.io_awsclustercontrolleridentities.yaml",
	"infrastructure.cluster.x-k8s.io_awsclusterroleidentities.yaml",
	"infrastructure.cluster.x-k8s.io_awsclusterstaticidentities.yaml",
}

// RepoRoot is the repository's root directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

var moduleDirs sync.Map

// ModuleDir returns the module cache directory of a dependency of this module.
func ModuleDir(module string) (string, error) {
	if d, ok := moduleDirs.Load(module); ok {
		return d.(string), nil
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", module)
	cmd.Dir = RepoRoot()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("locating module %s: %w: %s", module, err, stderr.String())
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", fmt.Errorf("module %s is not downloaded", module)
	}
	moduleDirs.Store(module, dir)
	return dir, nil
}

// HubCRDs returns the Cluster API, CABPK and CAPA CRDs, served at v1beta2
// only: without Cluster API's conversion webhooks running, older versions
// cannot be served. CABPK's and CAPA's CRDs get the contract label Cluster
// API looks for (clusterctl's kustomization adds it to CABPK's).
func HubCRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	capi, err := ModuleDir("sigs.k8s.io/cluster-api")
	if err != nil {
		return nil, err
	}
	capa, err := ModuleDir("sigs.k8s.io/cluster-api-provider-aws/v2")
	if err != nil {
		return nil, err
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, f := range clusterAPICRDs {
		crd, err := readCRD(filepath.Join(capi, "core", "config", "crd", "bases", f))
		if err != nil {
			return nil, err
		}
		out = append(out, onlyVersion(crd, "v1beta2"))
	}
	for _, f := range cabpkCRDs {
		crd, err := readCRD(filepath.Join(capi, "bootstrap", "kubeadm", "config", "crd", "bases", f))
		if err != nil {
			return nil, err
		}
		crd = onlyVersion(crd, "v1beta2")
		if crd.Labels == nil {
			crd.Labels = map[string]string{}
		}
		crd.Labels["cluster.x-k8s.io/v1beta2"] = "v1beta2"
		out = append(out, crd)
	}
	more, err := readCAPACRDs(capa, capaCRDs)
	if err != nil {
		return nil, err
	}
	return append(out, more...), nil
}

// CAPAControllerCRDs returns the CAPA CRDs, beyond HubCRDs, that CAPA's
// own controller manager needs (the AWS identity kinds), served at v1beta2.
func CAPAControllerCRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	capa, err := ModuleDir("sigs.k8s.io/cluster-api-provider-aws/v2")
	if err != nil {
		return nil, err
	}
	return readCAPACRDs(capa, capaControllerCRDs)
}

func readCAPACRDs(capa string, files []string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		crd, err := readCRD(filepath.Join(capa, "config", "crd", "bases", f))
		if err != nil {
			return nil, err
		}
		crd = onlyVersion(crd, "v1beta2")
		if crd.Labels == nil {
			crd.Labels = map[string]string{}
		}
		if _, ok := crd.Labels["cluster.x-k8s.io/v1beta1"]; !ok {
			crd.Labels["cluster.x-k8s.io/v1beta1"] = "v1beta1_v1beta2"
		}
		out = append(out, crd)
	}
	return out, nil
}

// SpokeCRDs returns Karpenter's CRDs and this project's NodeClass CRD.
func SpokeCRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	out := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(karpapis.CRDs)+1)
	for _, crd := range karpapis.CRDs {
		out = append(out, crd.DeepCopy())
	}
	own, err := filepath.Glob(filepath.Join(RepoRoot(), "config", "crd", "bases", "*.yaml"))
	if err != nil {
		return nil, err
	}
	for _, f := range own {
		crd, err := readCRD(f)
		if err != nil {
			return nil, err
		}
		out = append(out, crd)
	}
	return out, nil
}

func readCRD(path string) (*apiextensionsv1.CustomResourceDefinition, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading CRD: %w", err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096).Decode(crd); err != nil {
		return nil, fmt.Errorf("decoding CRD %s: %w", path, err)
	}
	return crd, nil
}

func onlyVersion(crd *apiextensionsv1.CustomResourceDefinition, version string) *apiextensionsv1.CustomResourceDefinition {
	var kept []apiextensionsv1.CustomResourceDefinitionVersion
	for _, v := range crd.Spec.Versions {
		if v.Name == version {
			v.Served, v.Storage = true, true
			kept = append(kept, v)
		}
	}
	crd.Spec.Versions = kept
	crd.Spec.Conversion = nil
	return crd
}
