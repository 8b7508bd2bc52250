package environment

import (
	"fmt"
	"os"
	"path/filepath"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	_ "github.com/autonode/karpenter-clusterapi/pkg/apis" // registers the types in client-go's scheme
)

// Cluster is one running API server with a client.
type Cluster struct {
	Name   string
	Env    *envtest.Environment
	Config *rest.Config
	Client client.Client
}

// Start starts an API server with the given CRDs installed. It needs
// KUBEBUILDER_ASSETS (make test sets it; `make envtest` prints it).
func Start(name string, crds []*apiextensionsv1.CustomResourceDefinition) (*Cluster, error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return nil, fmt.Errorf("KUBEBUILDER_ASSETS is not set: run the tests with 'make test', or export KUBEBUILDER_ASSETS=$(hack/envtest-bins.sh)")
	}
	env := &envtest.Environment{
		CRDs:                  crds,
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme.Scheme,
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting %s API server: %w", name, err)
	}
	cfg.QPS, cfg.Burst = 500, 1000
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	return &Cluster{Name: name, Env: env, Config: cfg, Client: c}, nil
}

// StartHub starts a management cluster with the Cluster API and CAPA CRDs.
func StartHub() (*Cluster, error) {
	crds, err := HubCRDs()
	if err != nil {
		return nil, err
	}
	return Start("hub", crds)
}

// StartSpoke starts a workload cluster with the Karpenter and NodeClass CRDs.
func StartSpoke() (*Cluster, error) {
	crds, err := SpokeCRDs()
	if err != nil {
		return nil, err
	}
	return Start("spoke", crds)
}

// Stop stops the API server.
func (c *Cluster) Stop() error {
	if c == nil || c.Env == nil {
		return nil
	}
	return c.Env.Stop()
}

// WriteKubeconfig writes a kubeconfig for this cluster into dir and returns its path.
func (c *Cluster) WriteKubeconfig(dir string) (string, error) {
	data, err := KubeconfigBytes(c.Config, c.Name)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, c.Name+".kubeconfig")
	return path, os.WriteFile(path, data, 0o600)
}

// KubeconfigBytes renders a rest.Config as a kubeconfig file.
func KubeconfigBytes(cfg *rest.Config, name string) ([]byte, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthorityData: cfg.CAData,
	}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData,
		ClientKeyData:         cfg.KeyData,
		Token:                 cfg.BearerToken,
	}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	kc.CurrentContext = name
	return clientcmd.Write(*kc)
}
