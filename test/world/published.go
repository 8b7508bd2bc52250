package world

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/rest"
	addonsv1beta1 "sigs.k8s.io/cluster-api/api/addons/v1beta1"
	addonsv1 "sigs.k8s.io/cluster-api/api/addons/v1beta2"
	bootstrapv1beta1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta1"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1beta1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta1"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"
	bootstrapadmission "sigs.k8s.io/cluster-api/bootstrap/kubeadm/webhooks/admission"
	kcpadmission "sigs.k8s.io/cluster-api/controlplane/kubeadm/webhooks/admission"
	kcpconversion "sigs.k8s.io/cluster-api/controlplane/kubeadm/webhooks/conversion"
	"sigs.k8s.io/cluster-api/core/reconcilers/clusterclass"
	topologycluster "sigs.k8s.io/cluster-api/core/reconcilers/topology/cluster"
	topologymachinedeployment "sigs.k8s.io/cluster-api/core/reconcilers/topology/machinedeployment"
	topologymachineset "sigs.k8s.io/cluster-api/core/reconcilers/topology/machineset"
	coreadmission "sigs.k8s.io/cluster-api/core/webhooks/admission"
	coreconversion "sigs.k8s.io/cluster-api/core/webhooks/conversion"
	"sigs.k8s.io/cluster-api/feature"
	"sigs.k8s.io/cluster-api/util/contract"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"strings"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// A world started with Options.Published also takes the clusters users
// write, as CAPA publishes them (clusterctl templates, ClusterClasses):
//
//   - the hub serves the older Cluster API versions too (v1beta1 of core,
//     kubeadm bootstrap, kubeadm control plane, addons), converted by Cluster
//     API's real conversion webhooks, as a management cluster with Cluster API
//     installed by clusterctl does;
//   - it has the ClusterClass, ClusterResourceSet(Binding),
//     KubeadmControlPlane(Template) and AWSClusterTemplate CRDs, with their
//     contract labels and Cluster API's real admission webhooks;
//   - Cluster API's real topology reconcilers run (clusterclass,
//     topology/cluster, topology/machinedeployment, topology/machineset),
//     with the ClusterTopology feature gate on, as core/main.go wires them;
//   - a simulated kubeadm control plane (kubeadmcontrolplane.go) reports
//     every KubeadmControlPlane's control plane as up, at its spec.version,
//     and writes the "<cluster>-kubeconfig" Secret of the workload cluster
//     PrepareCluster started for it;
//   - SimAWS gives an AWSCluster without a control plane endpoint the
//     address of that workload cluster (CAPA: the load balancer's DNS name).
//
// Not run: the ClusterResourceSet controller (the addons of CAPA's templates
// are a CNI, the AWS cloud controller manager and the EBS CSI driver, which
// need real nodes), CAPA's own controllers (SimAWS stands in), KCP's real
// controller (it needs etcd members and static pods on control plane nodes).

// publishedWebhookResources are the kinds whose real webhooks the world
// serves in addition to webhookResources, with the file they come from.
var publishedWebhookResources = map[string]sets.Set[string]{
	filepath.Join("core", "config", "webhook", "manifests.yaml"): sets.New(
		"clusterclasses", "clusterresourcesets", "clusterresourcesetbindings"),
	filepath.Join("controlplane", "kubeadm", "config", "webhook", "manifests.yaml"): sets.New(
		"kubeadmcontrolplanes", "kubeadmcontrolplanetemplates"),
	filepath.Join("bootstrap", "kubeadm", "config", "webhook", "manifests.yaml"): sets.New(
		"kubeadmconfigs", "kubeadmconfigtemplates"),
}

// enablePublished turns on the ClusterTopology feature gate (process-wide,
// like core/main.go's --feature-gates): the Cluster webhook refuses
// topologies and the index for ClusterClass references is not added without it.
//
// KubeadmBootstrapFormatIgnition too: CAPA's -flatcar flavours bootstrap
// with Ignition, which CABPK's webhooks refuse without it (clusterctl users
// set EXP_KUBEADM_BOOTSTRAP_FORMAT_IGNITION=true for them).
func enablePublished() error {
	return feature.MutableGates.Set(string(feature.ClusterTopology) + "=true," + string(feature.KubeadmBootstrapFormatIgnition) + "=true")
}

// addPublishedTypes registers the types of the older versions and of the
// kubeadm control plane and addons in the hub manager's scheme.
func addPublishedTypes(s *runtime.Scheme) error {
	for _, add := range []func(*runtime.Scheme) error{
		addonsv1beta1.AddToScheme, addonsv1.AddToScheme,
		bootstrapv1beta1.AddToScheme, bootstrapv1.AddToScheme,
		controlplanev1beta1.AddToScheme, controlplanev1.AddToScheme,
		runtimev1.AddToScheme, // ExtensionConfig, which the ClusterClass controller watches
	} {
		if err := add(s); err != nil {
			return err
		}
	}
	return nil
}

// setupPublished adds the topology reconcilers and the webhooks of the
// published kinds to the hub manager, as Cluster API's core, kubeadm
// bootstrap and kubeadm control plane main.go files do.
func (h *hubManager) setupPublished(ctx context.Context) error {
	mgr := h.mgr
	apiVersionOf := func(ctx context.Context, gk schema.GroupKind) (string, error) {
		return latestContractAPIVersion(ctx, mgr.GetClient(), gk)
	}
	coreconversion.SetAPIVersionGetter(apiVersionOf)
	kcpconversion.SetAPIVersionGetter(apiVersionOf)

	if err := (&clusterclass.Reconciler{Client: mgr.GetClient()}).
		SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 10}); err != nil {
		return fmt.Errorf("clusterclass controller: %w", err)
	}
	if err := (&topologycluster.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: h.clusterCache,
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 10}); err != nil {
		return fmt.Errorf("topology cluster controller: %w", err)
	}
	if err := (&topologymachinedeployment.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()}).
		SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 25}); err != nil {
		return fmt.Errorf("topology machinedeployment controller: %w", err)
	}
	if err := (&topologymachineset.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()}).
		SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 25}); err != nil {
		return fmt.Errorf("topology machineset controller: %w", err)
	}
	for name, setupWebhook := range map[string]func(ctrl.Manager) error{
		"ClusterClass":                (&coreadmission.ClusterClass{Client: mgr.GetClient()}).SetupWebhookWithManager,
		"ClusterResourceSet":          (&coreadmission.ClusterResourceSet{}).SetupWebhookWithManager,
		"ClusterResourceSetBinding":   (&coreadmission.ClusterResourceSetBinding{}).SetupWebhookWithManager,
		"KubeadmControlPlane":         (&kcpadmission.KubeadmControlPlane{}).SetupWebhookWithManager,
		"KubeadmControlPlaneTemplate": (&kcpadmission.KubeadmControlPlaneTemplate{}).SetupWebhookWithManager,
		"KubeadmConfig":               (&bootstrapadmission.KubeadmConfig{}).SetupWebhookWithManager,
		"KubeadmConfigTemplate":       (&bootstrapadmission.KubeadmConfigTemplate{}).SetupWebhookWithManager,
	} {
		if err := setupWebhook(mgr); err != nil {
			return fmt.Errorf("%s webhook: %w", name, err)
		}
	}
	return nil
}

// installPublishedCRDs installs the published kinds' CRDs and updates the
// Cluster API CRDs the hub started with to serve every version, converted
// by the world's webhook server (which must serve already).
func (w *World) installPublishedCRDs() error {
	capi, err := environment.ModuleDir("sigs.k8s.io/cluster-api")
	if err != nil {
		return err
	}
	capa, err := environment.ModuleDir("sigs.k8s.io/cluster-api-provider-aws/v2")
	if err != nil {
		return err
	}
	core := func(f string) string { return filepath.Join(capi, "core", "config", "crd", "bases", f) }
	kubeadm := func(kind, f string) string { return filepath.Join(capi, kind, "kubeadm", "config", "crd", "bases", f) }
	// Every version with a conversion webhook; the contract labels are those
	// of each provider's config/crd/kustomization.yaml.
	converted := map[string]map[string]string{
		core("cluster.x-k8s.io_clusters.yaml"):                                                     nil,
		core("cluster.x-k8s.io_machines.yaml"):                                                     nil,
		core("cluster.x-k8s.io_machinesets.yaml"):                                                  nil,
		core("cluster.x-k8s.io_machinedeployments.yaml"):                                           nil,
		core("cluster.x-k8s.io_machinehealthchecks.yaml"):                                          nil,
		core("cluster.x-k8s.io_machinedrainrules.yaml"):                                            nil,
		core("cluster.x-k8s.io_clusterclasses.yaml"):                                               nil,
		core("addons.cluster.x-k8s.io_clusterresourcesets.yaml"):                                   nil,
		core("addons.cluster.x-k8s.io_clusterresourcesetbindings.yaml"):                            nil,
		kubeadm("bootstrap", "bootstrap.cluster.x-k8s.io_kubeadmconfigs.yaml"):                     kubeadmContractLabels,
		kubeadm("bootstrap", "bootstrap.cluster.x-k8s.io_kubeadmconfigtemplates.yaml"):             kubeadmContractLabels,
		kubeadm("controlplane", "controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.yaml"):         kubeadmContractLabels,
		kubeadm("controlplane", "controlplane.cluster.x-k8s.io_kubeadmcontrolplanetemplates.yaml"): kubeadmContractLabels,
	}
	url := fmt.Sprintf("https://%s:%d/convert", w.hub.webhooks.LocalServingHost, w.hub.webhooks.LocalServingPort)
	var crds []*apiextensionsv1.CustomResourceDefinition
	for path, labels := range converted {
		crd, err := readCRDFile(path)
		if err != nil {
			return err
		}
		for k, v := range labels {
			if crd.Labels == nil {
				crd.Labels = map[string]string{}
			}
			crd.Labels[k] = v
		}
		crd.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{
			Strategy: apiextensionsv1.WebhookConverter,
			Webhook: &apiextensionsv1.WebhookConversion{
				ClientConfig:             &apiextensionsv1.WebhookClientConfig{URL: &url, CABundle: w.hub.webhooks.LocalServingCAData},
				ConversionReviewVersions: []string{"v1", "v1beta1"},
			},
		}
		crds = append(crds, crd)
	}
	// CAPA's AWSClusterTemplate, at v1beta2 like the other CAPA kinds of the world.
	act, err := readCRDFile(filepath.Join(capa, "config", "crd", "bases", "infrastructure.cluster.x-k8s.io_awsclustertemplates.yaml"))
	if err != nil {
		return err
	}
	act = onlyV1Beta2(act)
	if act.Labels == nil {
		act.Labels = map[string]string{}
	}
	act.Labels["cluster.x-k8s.io/v1beta1"] = "v1beta1_v1beta2"
	crds = append(crds, act)
	// The ClusterClass controller watches ExtensionConfigs (Runtime SDK, off):
	// the kind must exist, at v1beta2 (nobody writes one).
	ext, err := readCRDFile(core("runtime.cluster.x-k8s.io_extensionconfigs.yaml"))
	if err != nil {
		return err
	}
	crds = append(crds, onlyV1Beta2(ext))

	// envtest updates the CRDs that exist and waits until all are served.
	_, err = envtest.InstallCRDs(rest.CopyConfig(w.Hub.Config), envtest.CRDInstallOptions{CRDs: crds})
	if err != nil {
		return fmt.Errorf("installing the published kinds' CRDs: %w", err)
	}
	return nil
}

// kubeadmContractLabels are the contract labels of the kubeadm bootstrap and
// control plane CRDs: v1beta1 objects in ClusterClasses need the first.
var kubeadmContractLabels = map[string]string{"cluster.x-k8s.io/v1beta1": "v1beta1", "cluster.x-k8s.io/v1beta2": "v1beta2"}

func readCRDFile(path string) (*apiextensionsv1.CustomResourceDefinition, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096).Decode(crd); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", path, err)
	}
	return crd, nil
}

// latestContractAPIVersion is what Cluster API's internal
// contract.GetAPIVersion returns (not importable): the newest API version of
// a kind that its CRD's contract label names, preferring the v1beta2 contract.
// The conversion webhooks use it to write v1beta1 references.
func latestContractAPIVersion(ctx context.Context, c client.Reader, gk schema.GroupKind) (string, error) {
	crd := &metav1.PartialObjectMetadata{}
	crd.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
	if err := c.Get(ctx, client.ObjectKey{Name: contract.CalculateCRDName(gk.Group, gk.Kind)}, crd); err != nil {
		return "", fmt.Errorf("getting the CRD of %s: %w", gk, err)
	}
	for _, contractVersion := range []string{"v1beta2", "v1beta1"} {
		versions := crd.Labels["cluster.x-k8s.io/"+contractVersion]
		if versions == "" {
			continue
		}
		list := strings.Split(versions, "_")
		latest := list[0]
		for _, v := range list[1:] {
			if version.CompareKubeAwareVersionStrings(v, latest) > 0 {
				latest = v
			}
		}
		return schema.GroupVersion{Group: gk.Group, Version: latest}.String(), nil
	}
	return "", fmt.Errorf("the CRD of %s has no contract label", gk)
}

func onlyV1Beta2(crd *apiextensionsv1.CustomResourceDefinition) *apiextensionsv1.CustomResourceDefinition {
	var kept []apiextensionsv1.CustomResourceDefinitionVersion
	for _, v := range crd.Spec.Versions {
		if v.Name == "v1beta2" {
			v.Served, v.Storage = true, true
			kept = append(kept, v)
		}
	}
	crd.Spec.Versions, crd.Spec.Conversion = kept, nil
	return crd
}
