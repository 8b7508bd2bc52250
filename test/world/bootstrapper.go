package world

import (
	"context"
	"crypto/rand"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// The simulated bootstrap provider stands in for Cluster API's kubeadm
// bootstrap provider (CABPK): the hub serves CABPK's real KubeadmConfig and
// KubeadmConfigTemplate CRDs (v1beta2, bootstrap contract v1beta2), and for
// every KubeadmConfig owned by a Machine it renders BootstrapData into a
// data Secret, the way CABPK renders cloud-init:
//
//   - taints from joinConfiguration.nodeRegistration.taints (none when unset,
//     as kubeadm join does for workers),
//   - labels from the kubelet argument node-labels ("k1=v1,k2=v2"),
//   - KubeletArgs from joinConfiguration.nodeRegistration.kubeletExtraArgs
//     (a later duplicate wins, as the kubelet's flag parsing does),
//   - BootstrapToken from joinConfiguration.discovery.bootstrapToken.token,
//     which, like CABPK, it first sets to a new token of the Machine's own
//     when the spec has none ("<6 of [a-z0-9]>.<16 of [a-z0-9]>"; the
//     workload cluster's token Secret is not written: the simulated kubelet
//     impersonates system:bootstrap:<id> rather than authenticating).
//
// The Secret is named like the KubeadmConfig, labelled with the cluster name,
// of type cluster.x-k8s.io/secret and controlled by the KubeadmConfig. The
// KubeadmConfig's status then carries what Cluster API's Machine controller
// reads under the v1beta2 contract: status.dataSecretName and
// status.initialization.dataSecretCreated=true (plus Ready and
// DataSecretAvailable conditions). Like CABPK it waits for the Machine owner
// reference and for the Cluster's control plane to be initialized.
//
// MachineDeployments use it with spec.template.spec.bootstrap.configRef to a
// KubeadmConfigTemplate (environment.MachineDeploymentOptions.BootstrapTemplate);
// MachineSets clone the template into one KubeadmConfig per Machine.
// Standalone Machines reference a KubeadmConfig of their own.

// Names of the kinds the simulated bootstrap provider serves.
const (
	KubeadmConfigKind         = "KubeadmConfig"
	KubeadmConfigTemplateKind = "KubeadmConfigTemplate"
)

// Condition types the simulated bootstrap provider sets on KubeadmConfigs.
const (
	bootstrapReadyCondition         = "Ready"
	bootstrapDataAvailableCondition = "DataSecretAvailable"
)

// KubeadmConfigTemplate returns a KubeadmConfigTemplate whose nodes join with
// Karpenter's unregistered taint and the given kubelet arguments (flag names
// without "--", e.g. "max-pods": "20", "kube-reserved": "cpu=100m").
func KubeadmConfigTemplate(namespace, name string, kubeletArgs map[string]string) *bootstrapv1.KubeadmConfigTemplate {
	return &bootstrapv1.KubeadmConfigTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: bootstrapv1.KubeadmConfigTemplateSpec{Template: bootstrapv1.KubeadmConfigTemplateResource{
			Spec: KubeadmConfigSpec(kubeletArgs),
		}},
	}
}

// KubeadmConfigSpec is the spec of KubeadmConfigTemplate: a join
// configuration with Karpenter's unregistered taint and the kubelet arguments.
func KubeadmConfigSpec(kubeletArgs map[string]string) bootstrapv1.KubeadmConfigSpec {
	names := make([]string, 0, len(kubeletArgs))
	for n := range kubeletArgs {
		names = append(names, n)
	}
	sort.Strings(names)
	var args []bootstrapv1.Arg
	for _, n := range names {
		args = append(args, bootstrapv1.Arg{Name: n, Value: ptr.To(kubeletArgs[n])})
	}
	return bootstrapv1.KubeadmConfigSpec{
		JoinConfiguration: bootstrapv1.JoinConfiguration{NodeRegistration: bootstrapv1.NodeRegistrationOptions{
			Taints:           &[]corev1.Taint{UnregisteredTaint},
			KubeletExtraArgs: args,
		}},
	}
}

// CreateKubeadmConfigTemplate creates KubeadmConfigTemplate(namespace of the
// world, name, kubeletArgs) in the hub.
func (w *World) CreateKubeadmConfigTemplate(ctx context.Context, name string, kubeletArgs map[string]string) (*bootstrapv1.KubeadmConfigTemplate, error) {
	t := KubeadmConfigTemplate(w.Namespace, name, kubeletArgs)
	if err := w.Hub.Client.Create(ctx, t); err != nil {
		return nil, fmt.Errorf("creating KubeadmConfigTemplate %s: %w", name, err)
	}
	return t, nil
}

// BootstrapDataOf is what the simulated bootstrap provider renders for a
// KubeadmConfig spec.
func BootstrapDataOf(spec bootstrapv1.KubeadmConfigSpec) BootstrapData {
	reg := spec.JoinConfiguration.NodeRegistration
	d := BootstrapData{Labels: map[string]string{}}
	if reg.Taints != nil {
		d.Taints = append([]corev1.Taint(nil), (*reg.Taints)...)
	}
	for _, a := range reg.KubeletExtraArgs {
		if d.KubeletArgs == nil {
			d.KubeletArgs = map[string]string{}
		}
		d.KubeletArgs[a.Name] = ptr.Deref(a.Value, "")
	}
	d.BootstrapToken = spec.JoinConfiguration.Discovery.BootstrapToken.Token
	for _, kv := range strings.Split(d.KubeletArgs["node-labels"], ",") {
		if k, v, ok := strings.Cut(strings.TrimSpace(kv), "="); ok && k != "" {
			d.Labels[k] = v
		}
	}
	return d
}

// simBootstrapper is the simulated bootstrap provider's controller.
type simBootstrapper struct {
	client client.Client
}

// newBootstrapManager runs the simulated bootstrap provider against the hub
// in a manager of its own, as CABPK runs in a controller manager of its own.
func newBootstrapManager(cfg *rest.Config, log logr.Logger) (ctrl.Manager, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, clusterv1.AddToScheme, bootstrapv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	mgr, err := ctrl.NewManager(rest.CopyConfig(cfg), ctrl.Options{
		Scheme:                 s,
		Logger:                 log,
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// Like CABPK, do not cache every Secret of the hub.
		Client: client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		Cache:  cache.Options{NewInformer: reconnectingInformer}, // see StopHubAPIServer
	})
	if err != nil {
		return nil, err
	}
	b := &simBootstrapper{client: mgr.GetClient()}
	return mgr, ctrl.NewControllerManagedBy(mgr).Named("sim-bootstrap-kubeadmconfig").
		For(&bootstrapv1.KubeadmConfig{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: cabpkKubeadmConfigConcurrency}).
		Complete(b)
}

// Reconcile renders a KubeadmConfig's bootstrap data Secret once.
func (b *simBootstrapper) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	cfg := &bootstrapv1.KubeadmConfig{}
	if err := b.client.Get(ctx, req.NamespacedName, cfg); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !cfg.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil // the Secret goes with it (owner reference)
	}
	if ptr.Deref(cfg.Status.Initialization.DataSecretCreated, false) && cfg.Status.DataSecretName != "" {
		return reconcile.Result{}, nil // rendered once, like CABPK for a joined node
	}
	// CABPK waits for Cluster API's Machine controller to own the config.
	if ownerMachine(cfg) == "" {
		return reconcile.Result{}, nil // the owner reference update brings us back
	}
	clusterName := cfg.Labels[clusterv1.ClusterNameLabel]
	if clusterName == "" {
		return reconcile.Result{}, nil // set together with the owner reference
	}
	cluster := &clusterv1.Cluster{}
	if err := b.client.Get(ctx, client.ObjectKey{Namespace: cfg.Namespace, Name: clusterName}, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{RequeueAfter: 5 * time.Second}, nil
		}
		return reconcile.Result{}, err
	}
	// A worker joins only once the control plane is initialized.
	if !conditions.IsTrue(cluster, clusterv1.ClusterControlPlaneInitializedCondition) {
		return reconcile.Result{RequeueAfter: 2 * time.Second}, nil
	}

	// Like CABPK, a join without a token gets one of its own, written into
	// the spec before the data that carries it.
	if cfg.Spec.JoinConfiguration.Discovery.BootstrapToken.Token == "" {
		token, err := newBootstrapToken()
		if err != nil {
			return reconcile.Result{}, err
		}
		patch := client.MergeFrom(cfg.DeepCopy())
		cfg.Spec.JoinConfiguration.Discovery.BootstrapToken.Token = token
		if err := b.client.Patch(ctx, cfg, patch); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
	}
	secret, err := BootstrapSecret(cfg.Namespace, cfg.Name, clusterName, BootstrapDataOf(cfg.Spec))
	if err != nil {
		return reconcile.Result{}, err
	}
	secret.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: bootstrapv1.GroupVersion.String(), Kind: KubeadmConfigKind,
		Name: cfg.Name, UID: cfg.UID, Controller: ptr.To(true),
	}}
	if err := b.client.Create(ctx, secret); err != nil && !apierrors.IsAlreadyExists(err) {
		return reconcile.Result{}, fmt.Errorf("creating bootstrap data Secret %s/%s: %w", secret.Namespace, secret.Name, err)
	}

	patch := client.MergeFrom(cfg.DeepCopy())
	cfg.Status.DataSecretName = secret.Name
	cfg.Status.Initialization.DataSecretCreated = ptr.To(true)
	cfg.Status.ObservedGeneration = cfg.Generation
	for _, t := range []string{bootstrapDataAvailableCondition, bootstrapReadyCondition} {
		meta.SetStatusCondition(&cfg.Status.Conditions, metav1.Condition{
			Type: t, Status: metav1.ConditionTrue, Reason: "DataSecretAvailable", ObservedGeneration: cfg.Generation,
		})
	}
	if err := b.client.Status().Patch(ctx, cfg, patch); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	return reconcile.Result{}, nil
}

// newBootstrapToken makes a kubeadm bootstrap token "<id>.<secret>" (6 and
// 16 characters of [a-z0-9]), as k8s.io/cluster-bootstrap generates them.
func newBootstrapToken() (string, error) {
	const chars = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 22)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating a bootstrap token: %w", err)
	}
	for i := range b {
		b[i] = chars[int(b[i])%len(chars)]
	}
	return string(b[:6]) + "." + string(b[6:]), nil
}

// BootstrapTokenUserOf is the user a kubelet joining with bootstrap data d
// asks for its client certificate as.
func BootstrapTokenUserOf(d BootstrapData) string {
	if id, _, ok := strings.Cut(d.BootstrapToken, "."); ok && id != "" {
		return "system:bootstrap:" + id
	}
	return BootstrapTokenUser
}

// ownerMachine returns the name of the Machine that owns the object, if any.
func ownerMachine(o metav1.Object) string {
	for _, ref := range o.GetOwnerReferences() {
		if ref.Kind == "Machine" && strings.HasPrefix(ref.APIVersion, clusterv1.GroupVersion.Group+"/") {
			return ref.Name
		}
	}
	return ""
}
