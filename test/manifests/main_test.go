package manifests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// The two API servers every test in this package applies to.
var hub, spoke *environment.Cluster

// extraHubCRDs are CRDs the examples use beyond what the test environment's
// hub serves, as (module-relative directory, file).
var extraHubCRDs = [][2]string{
	{"controlplane/kubeadm/config/crd/bases", "controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.yaml"},
	{"bootstrap/kubeadm/config/crd/bases", "bootstrap.cluster.x-k8s.io_kubeadmconfigtemplates.yaml"},
	{"bootstrap/kubeadm/config/crd/bases", "bootstrap.cluster.x-k8s.io_kubeadmconfigs.yaml"},
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// Build the pinned tools while the API servers start (minutes on a cold
	// build cache, nothing afterwards).
	warmTools()
	var err error
	if hub, err = startHub(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = hub.Stop() }()
	if spoke, err = environment.StartSpoke(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = spoke.Stop() }()
	return m.Run()
}

// startHub starts a management cluster that also serves the kubeadm control
// plane and bootstrap kinds, at v1beta2 only (no conversion webhooks run).
func startHub() (*environment.Cluster, error) {
	crds, err := environment.HubCRDs()
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, crd := range crds {
		have[crd.Name] = true
	}
	capi, err := environment.ModuleDir("sigs.k8s.io/cluster-api")
	if err != nil {
		return nil, err
	}
	for _, f := range extraHubCRDs {
		crd, err := readCRD(filepath.Join(capi, f[0], f[1]))
		if err != nil {
			return nil, err
		}
		if have[crd.Name] {
			continue
		}
		crds = append(crds, servedAtOnly(crd, "v1beta2"))
	}
	return environment.Start("hub", crds)
}

func servedAtOnly(crd *apiextensionsv1.CustomResourceDefinition, version string) *apiextensionsv1.CustomResourceDefinition {
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

// ctx is the context of every API call; the tests' own deadline bounds them.
var ctx = context.Background()
