package world

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1beta1 "sigs.k8s.io/cluster-api/api/core/v1beta1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/controllers/remote"
	"sigs.k8s.io/cluster-api/core/reconcilers/cluster"
	"sigs.k8s.io/cluster-api/core/reconcilers/machine"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinedeployment"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinehealthcheck"
	"sigs.k8s.io/cluster-api/core/reconcilers/machineset"
	"sigs.k8s.io/cluster-api/core/setup"
	coreadmission "sigs.k8s.io/cluster-api/core/webhooks/admission"
	"sigs.k8s.io/cluster-api/feature"
	"sigs.k8s.io/cluster-api/util/index"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/yaml"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// Settings of Cluster API's core controller manager (core/main.go flag
// defaults) the world runs with.
const (
	capiControllerName          = "cluster-api-controller-manager"
	capiSyncPeriod              = 10 * time.Minute
	capiKubeAPIQPS              = 100
	capiKubeAPIBurst            = 200
	capiClusterCacheQPS         = 20
	capiClusterCacheBurst       = 30
	capiClusterCacheConcurrency = 100
	capiClusterConcurrency      = 50
	capiMachineConcurrency      = 100
	capiMachineSetConcurrency   = 50
	capiMDConcurrency           = 50
	capiRemoteConnectionGrace   = 50 * time.Second
	capiRemoteConditionsGrace   = 5 * time.Minute
)

// Concurrency of the simulated parts, as what they stand for runs.
const (
	// capaAWSMachineConcurrency is CAPA's --awsmachine-concurrency default.
	capaAWSMachineConcurrency = 10
	// cabpkKubeadmConfigConcurrency is CABPK's --kubeadmconfig-concurrency
	// default.
	cabpkKubeadmConfigConcurrency = 100
	// kubeletConcurrency stands for each Node's own kubelet.
	kubeletConcurrency = 50
)

// hubScheme has what Cluster API's manager registers that the world uses,
// plus CAPA's types.
func hubScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme,
		apiextensionsv1.AddToScheme,
		clusterv1beta1.AddToScheme, // the conversion webhooks' spoke version
		clusterv1.AddToScheme,
		infrav1.AddToScheme,
	} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// webhookResources are the Cluster API kinds whose real admission webhooks
// (defaulting and validation) the world serves.
var webhookResources = sets.New("clusters", "machines", "machinesets", "machinedeployments", "machinehealthchecks", "machinedrainrules")

// hubManager is the management cluster's controller manager: Cluster API's
// core controllers and webhooks wired like core/main.go.
type hubManager struct {
	mgr          ctrl.Manager
	clusterCache clustercache.ClusterCache
	webhooks     *envtest.WebhookInstallOptions
	name         string
}

var worldCount atomic.Int64

func newHubManager(ctx context.Context, hubConfig *rest.Config, log logr.Logger, published bool) (*hubManager, error) {
	s, err := hubScheme()
	if err != nil {
		return nil, err
	}
	files := map[string]sets.Set[string]{filepath.Join("core", "config", "webhook", "manifests.yaml"): webhookResources}
	if published {
		if err := addPublishedTypes(s); err != nil {
			return nil, err
		}
		for f, res := range publishedWebhookResources {
			files[f] = files[f].Union(res)
		}
	}
	// Webhook serving certificates and the local address the hub's API server calls.
	wh := &envtest.WebhookInstallOptions{LocalServingHost: "127.0.0.1"}
	if wh.MutatingWebhooks, wh.ValidatingWebhooks, err = capiWebhookConfigurations(files); err != nil {
		return nil, err
	}
	if err := wh.PrepWithoutInstalling(); err != nil {
		return nil, fmt.Errorf("preparing webhook serving: %w", err)
	}

	// Cluster API registers its informers under the controller name once per
	// process (client-go's informer name registry): later worlds of the same
	// test binary get a numbered name.
	name := capiControllerName
	if n := worldCount.Add(1); n > 1 {
		name = fmt.Sprintf("%s-%d", capiControllerName, n)
	}
	cfg := rest.CopyConfig(hubConfig)
	cfg.QPS, cfg.Burst = capiKubeAPIQPS, capiKubeAPIBurst
	cfg.UserAgent = remote.DefaultClusterAPIUserAgent(name)
	cacheOpts := setup.ManagerCacheOptions(s, name, "", capiSyncPeriod)
	cacheOpts.NewInformer = reconnectingInformer // see StopHubAPIServer
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: s,
		Logger: log,
		Controller: config.Controller{
			UsePriorityQueue: ptr.To(feature.Gates.Enabled(feature.PriorityQueue)),
			CacheSyncTimeout: 5 * time.Minute,
			// Several worlds may run in one test binary, one after the other.
			SkipNameValidation: ptr.To(true),
		},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cacheOpts,
		Client:                 setup.ManagerClientOptions(),
		WebhookServer: webhook.NewServer(webhook.Options{
			Host:    wh.LocalServingHost,
			Port:    wh.LocalServingPort,
			CertDir: wh.LocalServingCertDir,
		}),
	})
	if err != nil {
		_ = wh.Cleanup()
		return nil, err
	}
	h := &hubManager{mgr: mgr, webhooks: wh, name: name}
	if err := h.setup(ctx); err != nil {
		_ = wh.Cleanup()
		return nil, err
	}
	if published {
		if err := h.setupPublished(ctx); err != nil {
			_ = wh.Cleanup()
			return nil, err
		}
	}
	return h, nil
}

func (h *hubManager) setup(ctx context.Context) error {
	mgr := h.mgr
	if err := index.AddDefaultIndexes(ctx, mgr); err != nil {
		return fmt.Errorf("cluster api indexes: %w", err)
	}
	secretCachingClient, err := setup.CreateSecretCachingClient(mgr)
	if err != nil {
		return err
	}
	h.clusterCache, err = clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient: secretCachingClient,
		Cache:        setup.ClusterCacheCacheOptions(),
		Client:       setup.ClusterCacheClientOptions(h.name, capiClusterCacheQPS, capiClusterCacheBurst),
	}, controller.Options{MaxConcurrentReconciles: capiClusterCacheConcurrency})
	if err != nil {
		return fmt.Errorf("cluster cache: %w", err)
	}
	if err := (&cluster.Reconciler{
		Client:                      mgr.GetClient(),
		APIReader:                   mgr.GetAPIReader(),
		ClusterCache:                h.clusterCache,
		RemoteConnectionGracePeriod: capiRemoteConnectionGrace,
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: capiClusterConcurrency}); err != nil {
		return fmt.Errorf("cluster controller: %w", err)
	}
	if err := (&machine.Reconciler{
		Client:                      mgr.GetClient(),
		APIReader:                   mgr.GetAPIReader(),
		ClusterCache:                h.clusterCache,
		RemoteConditionsGracePeriod: capiRemoteConditionsGrace,
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: capiMachineConcurrency}); err != nil {
		return fmt.Errorf("machine controller: %w", err)
	}
	if err := (&machineset.Reconciler{
		Client:       mgr.GetClient(),
		APIReader:    mgr.GetAPIReader(),
		ClusterCache: h.clusterCache,
		// core/main.go's default --machineset-preflight-checks=All. They pass:
		// the control plane is stable at KubeletVersion.
		PreflightChecks: sets.New(clusterv1.MachineSetPreflightCheckAll),
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: capiMachineSetConcurrency}); err != nil {
		return fmt.Errorf("machineset controller: %w", err)
	}
	if err := (&machinedeployment.Reconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: capiMDConcurrency}); err != nil {
		return fmt.Errorf("machinedeployment controller: %w", err)
	}
	// MachineHealthChecks remediate as in a management cluster; it acts only
	// on the MachineHealthChecks a test creates.
	if err := (&machinehealthcheck.Reconciler{
		Client:       mgr.GetClient(),
		ClusterCache: h.clusterCache,
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 1}); err != nil {
		return fmt.Errorf("machinehealthcheck controller: %w", err)
	}

	// Cluster API's admission webhooks, as core/main.go registers them.
	for name, setupWebhook := range map[string]func(ctrl.Manager) error{
		"Cluster":            (&coreadmission.Cluster{Client: mgr.GetClient(), ClusterCacheReader: h.clusterCache}).SetupWebhookWithManager,
		"Machine":            (&coreadmission.Machine{}).SetupWebhookWithManager,
		"MachineSet":         (&coreadmission.MachineSet{}).SetupWebhookWithManager,
		"MachineDeployment":  (&coreadmission.MachineDeployment{}).SetupWebhookWithManager,
		"MachineDrainRule":   (&coreadmission.MachineDrainRule{}).SetupWebhookWithManager,
		"MachineHealthCheck": (&coreadmission.MachineHealthCheck{}).SetupWebhookWithManager,
	} {
		if err := setupWebhook(mgr); err != nil {
			return fmt.Errorf("%s webhook: %w", name, err)
		}
	}
	return nil
}

// installWebhooks registers the webhook configurations in the hub once the
// manager serves them.
func (h *hubManager) installWebhooks(ctx context.Context, hubConfig *rest.Config) error {
	checker := h.mgr.GetWebhookServer().StartedChecker()
	deadline := time.Now().Add(30 * time.Second)
	for checker(nil) != nil {
		if time.Now().After(deadline) {
			return errors.New("webhook server did not start")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return h.webhooks.Install(hubConfig)
}

func (h *hubManager) shutdownClusterCache() {
	if s, ok := h.clusterCache.(interface{ Shutdown() }); ok {
		s.Shutdown()
	}
}

// capiWebhookConfigurations reads Cluster API's generated webhook
// configurations (files relative to the cluster-api module, each with the
// resources whose webhooks the world serves) and keeps those webhooks.
func capiWebhookConfigurations(files map[string]sets.Set[string]) ([]*admissionv1.MutatingWebhookConfiguration, []*admissionv1.ValidatingWebhookConfiguration, error) {
	dir, err := environment.ModuleDir("sigs.k8s.io/cluster-api")
	if err != nil {
		return nil, nil, err
	}
	var mutating []*admissionv1.MutatingWebhookConfiguration
	var validating []*admissionv1.ValidatingWebhookConfiguration
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	sort.Strings(names)
	for i, f := range names {
		m, v, err := webhookConfigurationsOf(filepath.Join(dir, f), files[f], "")
		if err != nil {
			return nil, nil, err
		}
		for _, c := range m {
			c.Name = fmt.Sprintf("world-capi-mutating-%d", i)
		}
		for _, c := range v {
			c.Name = fmt.Sprintf("world-capi-validating-%d", i)
		}
		mutating, validating = append(mutating, m...), append(validating, v...)
	}
	if len(mutating) == 0 || len(validating) == 0 {
		return nil, nil, errors.New("no Cluster API webhook configurations found")
	}
	return mutating, validating, nil
}

// webhookConfigurations reads a provider's generated webhook configurations
// (config/webhook/manifests.yaml) and keeps the webhooks whose rules name
// only the given resources (and, when version is set, that version), named
// <name>-mutating-<i> and <name>-validating-<i>.
func webhookConfigurations(path string, resources sets.Set[string], version, name string) ([]*admissionv1.MutatingWebhookConfiguration, []*admissionv1.ValidatingWebhookConfiguration, error) {
	mutating, validating, err := webhookConfigurationsOf(path, resources, version)
	if err != nil {
		return nil, nil, err
	}
	if len(mutating) == 0 || len(validating) == 0 {
		return nil, nil, fmt.Errorf("no webhook configurations found in %s", path)
	}
	for i, c := range mutating {
		c.Name = fmt.Sprintf("%s-mutating-%d", name, i)
	}
	for i, c := range validating {
		c.Name = fmt.Sprintf("%s-validating-%d", name, i)
	}
	return mutating, validating, nil
}

// webhookConfigurationsOf reads the webhook configurations of a file and
// keeps the webhooks whose rules name only the given resources (and, when
// version is set, that version); configurations left empty are dropped.
func webhookConfigurationsOf(path string, resources sets.Set[string], version string) ([]*admissionv1.MutatingWebhookConfiguration, []*admissionv1.ValidatingWebhookConfiguration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	keep := func(rules []admissionv1.RuleWithOperations) bool {
		for _, r := range rules {
			for _, res := range r.Resources {
				if !resources.Has(res) {
					return false
				}
			}
			if version != "" && !sets.New(r.APIVersions...).Has(version) {
				return false
			}
		}
		return len(rules) > 0
	}
	var mutating []*admissionv1.MutatingWebhookConfiguration
	var validating []*admissionv1.ValidatingWebhookConfiguration
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, err
		}
		var meta struct{ Kind string }
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return nil, nil, err
		}
		switch meta.Kind {
		case "MutatingWebhookConfiguration":
			c := &admissionv1.MutatingWebhookConfiguration{}
			if err := yaml.Unmarshal(doc, c); err != nil {
				return nil, nil, err
			}
			var hooks []admissionv1.MutatingWebhook
			for _, w := range c.Webhooks {
				if keep(w.Rules) {
					hooks = append(hooks, w)
				}
			}
			if c.Webhooks = hooks; len(hooks) > 0 {
				mutating = append(mutating, c)
			}
		case "ValidatingWebhookConfiguration":
			c := &admissionv1.ValidatingWebhookConfiguration{}
			if err := yaml.Unmarshal(doc, c); err != nil {
				return nil, nil, err
			}
			var hooks []admissionv1.ValidatingWebhook
			for _, w := range c.Webhooks {
				if keep(w.Rules) {
					hooks = append(hooks, w)
				}
			}
			if c.Webhooks = hooks; len(hooks) > 0 {
				validating = append(validating, c)
			}
		}
	}
	return mutating, validating, nil
}
