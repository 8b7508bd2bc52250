package world

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// ControlPlaneUpgradeDelay is how long the simulated kubeadm control plane
// takes to move to a new spec.version (KCP rolls its Machines meanwhile).
const ControlPlaneUpgradeDelay = 3 * time.Second

// simKCP simulates the kubeadm control plane provider behind Cluster API's
// real KubeadmControlPlane objects (served with their real CRD and webhooks):
// it never changes their spec, only writes what KCP writes.
//
//   - It waits, like KCP, for the owner Cluster (or the cluster-name label a
//     topology sets) and for the Cluster's control plane endpoint.
//   - It writes the "<cluster>-kubeconfig" Secret (KCP generates it from the
//     cluster CA it creates) with a kubeconfig of the workload cluster that
//     PrepareCluster started for that Cluster; a Cluster without one waits.
//   - Status: initialized, every replica ready, available and up to date, at
//     spec.version; a later spec.version (an upgrade) is reached after
//     ControlPlaneUpgradeDelay. Conditions Available and Initialized.
//
// No control plane Machines or Nodes exist: the workload cluster's API
// server is the envtest one, as with the world's managed control plane.
type simKCP struct {
	client client.Client
	log    logr.Logger

	mu sync.Mutex
	// spokes are the workload clusters PrepareCluster started, by Cluster.
	spokes map[types.NamespacedName]*rest.Config
	// upgrades are when a KubeadmControlPlane's spec.version was first seen
	// ahead of its status, by object and target version.
	upgrades map[upgradeKey]time.Time
}

type upgradeKey struct {
	uid     types.UID
	version string
}

func newSimKCP() *simKCP {
	return &simKCP{spokes: map[types.NamespacedName]*rest.Config{}, upgrades: map[upgradeKey]time.Time{}}
}

func (k *simKCP) addSpoke(cluster types.NamespacedName, cfg *rest.Config) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.spokes[cluster] = cfg
}

func (k *simKCP) spoke(cluster types.NamespacedName) *rest.Config {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.spokes[cluster]
}

// newKCPManager runs the simulated kubeadm control plane against the hub in
// a manager of its own, as KCP runs in a controller manager of its own.
func newKCPManager(cfg *rest.Config, k *simKCP, log logr.Logger) (ctrl.Manager, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, clusterv1.AddToScheme, controlplanev1.AddToScheme} {
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
		Client:                 client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		Cache:                  cache.Options{NewInformer: reconnectingInformer},
	})
	if err != nil {
		return nil, err
	}
	k.client, k.log = mgr.GetClient(), log
	return mgr, ctrl.NewControllerManagedBy(mgr).Named("sim-kubeadmcontrolplane").
		For(&controlplanev1.KubeadmControlPlane{}).
		Complete(k)
}

// Reconcile brings a KubeadmControlPlane's status (and kubeconfig Secret)
// to what KCP reports for a healthy control plane.
func (k *simKCP) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := k.client.Get(ctx, req.NamespacedName, kcp); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !kcp.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	clusterName := kcp.Labels[clusterv1.ClusterNameLabel]
	for _, ref := range kcp.OwnerReferences {
		if ref.Kind == "Cluster" {
			clusterName = ref.Name
		}
	}
	if clusterName == "" {
		return reconcile.Result{}, nil // the Cluster controller sets the owner reference
	}
	cluster := &clusterv1.Cluster{}
	if err := k.client.Get(ctx, client.ObjectKey{Namespace: kcp.Namespace, Name: clusterName}, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		return reconcile.Result{}, err
	}
	if !cluster.Spec.ControlPlaneEndpoint.IsValid() {
		return reconcile.Result{RequeueAfter: time.Second}, nil // KCP waits for it too
	}
	spoke := k.spoke(client.ObjectKeyFromObject(cluster))
	if spoke == nil {
		k.log.Info("no workload cluster prepared for this Cluster: waiting (World.PrepareCluster)", "cluster", clusterName)
		return reconcile.Result{RequeueAfter: 2 * time.Second}, nil
	}
	if err := k.ensureKubeconfig(ctx, kcp, clusterName, spoke); err != nil {
		return reconcile.Result{}, err
	}

	desired := kcp.Spec.Version
	reported := kcp.Status.Version
	var requeue time.Duration
	if reported != "" && reported != desired {
		key := upgradeKey{kcp.UID, desired}
		k.mu.Lock()
		start, ok := k.upgrades[key]
		if !ok {
			start = time.Now()
			k.upgrades[key] = start
		}
		k.mu.Unlock()
		if left := ControlPlaneUpgradeDelay - time.Since(start); left > 0 {
			requeue = left
		} else {
			reported = desired
		}
	} else {
		reported = desired
	}

	replicas := ptr.Deref(kcp.Spec.Replicas, 1)
	upToDate := replicas
	if reported != desired {
		upToDate = 0 // every Machine still runs the old version
	}
	patch := client.MergeFrom(kcp.DeepCopy())
	kcp.Status.Version = reported
	kcp.Status.Initialization.ControlPlaneInitialized = ptr.To(true)
	kcp.Status.Replicas = ptr.To(replicas)
	kcp.Status.ReadyReplicas = ptr.To(replicas)
	kcp.Status.AvailableReplicas = ptr.To(replicas)
	kcp.Status.UpToDateReplicas = ptr.To(upToDate)
	kcp.Status.Selector = fmt.Sprintf("%s=%s,%s", clusterv1.ClusterNameLabel, clusterName, clusterv1.MachineControlPlaneLabel)
	kcp.Status.ObservedGeneration = kcp.Generation
	for _, t := range []string{controlplanev1.KubeadmControlPlaneAvailableCondition, controlplanev1.KubeadmControlPlaneInitializedCondition} {
		meta.SetStatusCondition(&kcp.Status.Conditions, metav1.Condition{
			Type: t, Status: metav1.ConditionTrue, Reason: t, ObservedGeneration: kcp.Generation,
		})
	}
	if err := k.client.Status().Patch(ctx, kcp, patch); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	return reconcile.Result{RequeueAfter: requeue}, nil
}

// ensureKubeconfig writes the "<cluster>-kubeconfig" Secret once, owned by
// the KubeadmControlPlane as KCP's is.
func (k *simKCP) ensureKubeconfig(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane, clusterName string, spoke *rest.Config) error {
	name := clusterName + "-kubeconfig"
	err := k.client.Get(ctx, client.ObjectKey{Namespace: kcp.Namespace, Name: name}, &corev1.Secret{})
	if err == nil || !apierrors.IsNotFound(err) {
		return err
	}
	data, err := environment.KubeconfigBytes(spoke, clusterName)
	if err != nil {
		return err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: kcp.Namespace, Name: name,
			Labels: map[string]string{clusterv1.ClusterNameLabel: clusterName},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: controlplanev1.GroupVersion.String(), Kind: "KubeadmControlPlane",
				Name: kcp.Name, UID: kcp.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Type: clusterv1.ClusterSecretType,
		Data: map[string][]byte{"value": data},
	}
	if err := k.client.Create(ctx, secret); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating %s/%s: %w", kcp.Namespace, name, err)
	}
	return nil
}
