package autonode

import (
	"context"
	"errors"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// FieldOwner is AutoNode's field manager for every server-side apply.
const FieldOwner = ManagedBy

// How soon a Cluster is looked at again while it waits on something no
// watch reports (the workload cluster's NodeClaims, an unreachable API).
const (
	removingNodesRequeue = 3 * time.Second
	waitingRequeue       = 30 * time.Second
)

// Reconciler runs Karpenter for the Clusters that opt in.
type Reconciler struct {
	// Client reads Clusters, Deployments and kubeconfig Secrets from the
	// manager's cache and writes to the management cluster.
	Client client.Client
	// APIReader reads what the cache does not hold (the objects removed on
	// opt-out, control plane objects).
	APIReader client.Reader
	// RESTMapper finds the version of a Cluster's control plane kind; nil
	// reads the knob from the Cluster only.
	RESTMapper meta.RESTMapper
	Config     Config
	Recorder   record.EventRecorder
	// Workload opens a workload cluster's client; NewWorkloadClient by default.
	Workload WorkloadClients
	// InstallCRDs installs the CRDs in a workload cluster; NewInstallCRDs by default.
	InstallCRDs InstallCRDs
	// Now is the clock of condition transitions; time.Now by default.
	Now func() time.Time
}

// SetupWithManager watches Clusters, the provider Deployments AutoNode owns,
// the Clusters' kubeconfig Secrets and the providers' token Secrets.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Workload == nil {
		r.Workload = NewWorkloadClient
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	if r.InstallCRDs == nil {
		r.InstallCRDs = NewInstallCRDs
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("autonode").
		For(&clusterv1.Cluster{}).
		Owns(&appsv1.Deployment{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.GetLabels()[ManagedByLabel] == ManagedBy
		}))).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(clusterOfKubeconfig)).
		Complete(r)
}

// clusterOfKubeconfig maps "<cluster>-kubeconfig" and AutoNode's token
// Secret "<cluster>-karpenter-workload" to their Cluster.
func clusterOfKubeconfig(_ context.Context, o client.Object) []reconcile.Request {
	name := o.GetLabels()[clusterv1.ClusterNameLabel]
	if name == "" || (o.GetName() != name+"-kubeconfig" && o.GetName() != name+nameSuffix+"-workload") {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
}

// Reconcile observes one Cluster, decides and acts. Whatever goes wrong
// stays with this Cluster: the others are separate requests.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	c := &clusterv1.Cluster{}
	if err := r.Client.Get(ctx, req.NamespacedName, c); err != nil {
		if apierrors.IsNotFound(err) {
			readyGauge.DeleteLabelValues(req.Namespace, req.Name)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	o, provider, kubeconfig, err := r.observe(ctx, c)
	if err != nil {
		return reconcile.Result{}, err
	}
	d := Decide(o)
	if d.Step == Report && d.Reason == ReasonDisabled {
		// The Deployment's deletion is seen before the condition the
		// opt-out wrote with it reaches the cache: ask the API server, so
		// that how the opt-out ended is kept.
		fresh := &clusterv1.Cluster{}
		if err := r.APIReader.Get(ctx, req.NamespacedName, fresh); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
		if cond := currentCondition(fresh); cond != nil && cond.Reason == ReasonDisabled {
			d = Decision{Step: Leave}
		}
	}
	log.FromContext(ctx).V(1).Info("decided", "step", d.Step, "reason", d.Reason)
	switch d.Step {
	case Leave:
		return reconcile.Result{}, nil
	case Report:
		return r.report(ctx, c, d, requeueOf(d))
	case Apply:
		return r.apply(ctx, c, o.Settings, provider, kubeconfig)
	case DeleteNodePools:
		if err := r.deleteNodePools(ctx, kubeconfig); err != nil {
			d = Decision{Reason: ReasonWorkloadClusterUnreachable, Message: fmt.Sprintf("opting out: Cluster %s: %v", o.Cluster, err)}
		}
		return r.report(ctx, c, d, removingNodesRequeue)
	case WaitForNodes:
		return r.report(ctx, c, d, removingNodesRequeue)
	case RemoveProvider:
		if err := r.removeProvider(ctx, c, kubeconfig); err != nil {
			return reconcile.Result{}, err
		}
		return r.report(ctx, c, d, 0)
	}
	return reconcile.Result{}, fmt.Errorf("Cluster %s: unknown step %d", req, d.Step)
}

func requeueOf(d Decision) time.Duration {
	switch d.Reason {
	case ReasonWorkloadClusterUnreachable, ReasonHandInstalledProvider, ReasonRemovingNodes:
		return waitingRequeue
	}
	// The rest changes with the Cluster, its Secret or its Deployment: watched.
	return 0
}

// observe gathers what Decide needs: the Cluster's settings, Cluster API's
// signals, AutoNode's Deployment, and the workload cluster only when a
// decision depends on it (a first start, an opt-out).
func (r *Reconciler) observe(ctx context.Context, c *clusterv1.Cluster) (Observation, *appsv1.Deployment, []byte, error) {
	knobs := c
	if _, labelled := c.Labels[EnabledLabel]; !labelled {
		cp, err := controlPlaneMetadata(ctx, r.APIReader, r.RESTMapper, c)
		if err != nil {
			return Observation{}, nil, nil, err
		}
		knobs = withControlPlaneKnob(c, cp)
	}
	s, invalid := Parse(knobs)
	o := Observation{
		Cluster: c.Namespace + "/" + c.Name, Settings: s, Invalid: invalid,
		Deleting:                !c.DeletionTimestamp.IsZero(),
		ControlPlaneInitialized: ptr.Deref(c.Status.Initialization.ControlPlaneInitialized, false),
	}
	if cond := currentCondition(c); cond != nil {
		o.HasCondition, o.ConditionReason = true, cond.Reason
	}
	provider, err := r.provider(ctx, c)
	if err != nil {
		return o, nil, nil, err
	}
	o.ProviderExists = provider != nil
	kubeconfig, err := r.kubeconfig(ctx, c)
	if err != nil {
		return o, nil, nil, err
	}
	o.KubeconfigExists = kubeconfig != nil
	if o.Deleting || len(invalid) > 0 {
		return o, provider, kubeconfig, nil
	}
	switch {
	case s.Enabled && !o.ProviderExists && o.ControlPlaneInitialized && o.KubeconfigExists:
		o.HandInstalled, err = r.handInstalled(ctx, c, kubeconfig)
		if err != nil {
			// In doubt, refuse: a second provider is worse than a late one.
			o.HandInstalled = fmt.Sprintf("possibly a provider (%v)", err)
		}
	case !s.Enabled && o.ProviderExists && s.OnDisable == RemoveNodes:
		o.Workload = r.observeWorkload(ctx, kubeconfig)
	}
	return o, provider, kubeconfig, nil
}

// provider is AutoNode's Deployment of the Cluster, or nil.
func (r *Reconciler) provider(ctx context.Context, c *clusterv1.Cluster) (*appsv1.Deployment, error) {
	d := &appsv1.Deployment{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: ObjectName(c)}, d)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading Deployment %s/%s: %w", c.Namespace, ObjectName(c), err)
	case d.Labels[ManagedByLabel] != ManagedBy:
		return nil, nil // someone else's of that name: handInstalled sees it
	}
	return d, nil
}

// kubeconfig is the Cluster's kubeconfig (Secret "<cluster>-kubeconfig",
// key "value"), or nil.
func (r *Reconciler) kubeconfig(ctx context.Context, c *clusterv1.Cluster) ([]byte, error) {
	s := &corev1.Secret{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: KubeconfigSecretName(c)}, s)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading Secret %s/%s: %w", c.Namespace, KubeconfigSecretName(c), err)
	}
	if len(s.Data["value"]) == 0 {
		return nil, nil
	}
	return s.Data["value"], nil
}

func (r *Reconciler) handInstalled(ctx context.Context, c *clusterv1.Cluster, kubeconfig []byte) (string, error) {
	if found, err := handInstalledInHub(ctx, r.Client, c); err != nil || found != "" {
		return found, err
	}
	wl, err := r.Workload(kubeconfig)
	if err != nil {
		return "", fmt.Errorf("Cluster %s/%s: %w", c.Namespace, c.Name, err)
	}
	return handInstalledInWorkload(ctx, wl)
}

func (r *Reconciler) observeWorkload(ctx context.Context, kubeconfig []byte) *WorkloadObservation {
	if kubeconfig == nil {
		return &WorkloadObservation{Err: errors.New("no kubeconfig Secret")}
	}
	wl, err := r.Workload(kubeconfig)
	if err != nil {
		return &WorkloadObservation{Err: err}
	}
	return observeWorkload(ctx, wl)
}

func (r *Reconciler) deleteNodePools(ctx context.Context, kubeconfig []byte) error {
	wl, err := r.Workload(kubeconfig)
	if err != nil {
		return err
	}
	return deleteNodePools(ctx, wl)
}

// apply gives the provider its workload-cluster identity (ServiceAccount,
// RBAC, token Secret), server-side applies the desired objects, then
// reports the provider's state as last seen. It comes back before the
// token must be renewed.
func (r *Reconciler) apply(ctx context.Context, c *clusterv1.Cluster, s Settings, provider *appsv1.Deployment, kubeconfig []byte) (reconcile.Result, error) {
	failed := func(err error) (reconcile.Result, error) {
		d := Decision{Reason: ReasonApplyFailed, Message: fmt.Sprintf("Cluster %s/%s: %v", c.Namespace, c.Name, err)}
		if _, rerr := r.report(ctx, c, d, 0); rerr != nil {
			return reconcile.Result{}, errors.Join(err, rerr)
		}
		return reconcile.Result{}, err
	}
	// The CRDs on a first start and with each new controller version.
	installCRDs := provider == nil || provider.Annotations[VersionAnnotation] != r.Config.Version
	renewIn, err := r.ensureWorkloadIdentity(ctx, c, s, kubeconfig, installCRDs)
	if err != nil {
		return failed(err)
	}
	for _, obj := range Desired(c, s, r.Config) {
		if err := r.applyObject(ctx, obj); err != nil {
			return failed(err)
		}
	}
	return r.report(ctx, c, providerStatus(c.Namespace+"/"+c.Name, provider, s.Replicas, image(s, r.Config), r.Config.Version), renewIn)
}

func (r *Reconciler) applyObject(ctx context.Context, obj client.Object) error {
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: raw}
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u.Object, "spec", "template", "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u.Object, "status")
	if err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying %s %s/%s: %w", u.GetKind(), obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// removeProvider deletes AutoNode's objects of the Cluster: first the
// provider's ServiceAccount and RBAC in the workload cluster, then those in
// the management cluster; only objects carrying AutoNode's label (never
// another's of the same name), each at the version read (UID precondition).
// The Deployment goes last: it is what makes a Cluster count as having a
// provider, so a removal that fails half way is taken up again by the next
// reconcile instead of leaving the rest behind. Without a kubeconfig Secret
// the workload cluster cannot be reached: its objects stay.
func (r *Reconciler) removeProvider(ctx context.Context, c *clusterv1.Cluster, kubeconfig []byte) error {
	if kubeconfig != nil {
		if err := r.removeWorkloadIdentity(ctx, kubeconfig); err != nil {
			return fmt.Errorf("Cluster %s/%s: %w", c.Namespace, c.Name, err)
		}
	}
	key := client.ObjectKey{Namespace: c.Namespace, Name: ObjectName(c)}
	for _, obj := range []client.Object{&rbacv1.RoleBinding{}, &corev1.ServiceAccount{}, &corev1.ConfigMap{}, &corev1.Secret{}, &appsv1.Deployment{}} {
		key := key
		if _, ok := obj.(*corev1.Secret); ok {
			key.Name = TokenSecretName(c)
		}
		err := r.APIReader.Get(ctx, key, obj)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("Cluster %s/%s: reading %T %s: %w", c.Namespace, c.Name, obj, key, err)
		}
		if obj.GetLabels()[ManagedByLabel] != ManagedBy {
			continue
		}
		err = r.Client.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground), client.Preconditions{UID: ptr.To(obj.GetUID())})
		if client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("Cluster %s/%s: deleting %T %s: %w", c.Namespace, c.Name, obj, key, err)
		}
	}
	return nil
}

// report writes AutoNode's condition on the Cluster (server-side apply of
// that one condition, under AutoNode's field owner) and, when it changed,
// an event.
func (r *Reconciler) report(ctx context.Context, c *clusterv1.Cluster, d Decision, requeue time.Duration) (reconcile.Result, error) {
	setReady(c.Namespace, c.Name, d)
	cond := condition(c, d, metav1.NewTime(r.Now().Truncate(time.Second)))
	if old := currentCondition(c); old == nil || old.Status != cond.Status || old.Reason != cond.Reason || old.Message != cond.Message || old.ObservedGeneration != cond.ObservedGeneration {
		if err := r.applyCondition(ctx, c, cond); err != nil {
			return reconcile.Result{}, err
		}
		kind := corev1.EventTypeNormal
		if warning(d.Reason) {
			kind = corev1.EventTypeWarning
		}
		if old == nil || old.Reason != cond.Reason || old.Message != cond.Message {
			r.Recorder.Event(c, kind, "AutoNode"+d.Reason, d.Message)
		}
	}
	return reconcile.Result{RequeueAfter: requeue}, nil
}

func (r *Reconciler) applyCondition(ctx context.Context, c *clusterv1.Cluster, cond metav1.Condition) error {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": clusterv1.GroupVersion.String(),
		"kind":       "Cluster",
		"metadata":   map[string]any{"namespace": c.Namespace, "name": c.Name},
		"status": map[string]any{"conditions": []any{map[string]any{
			"type": cond.Type, "status": string(cond.Status), "reason": cond.Reason, "message": cond.Message,
			"observedGeneration": cond.ObservedGeneration, "lastTransitionTime": cond.LastTransitionTime.UTC().Format(time.RFC3339),
		}}},
	}}
	if err := r.Client.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("writing condition %s of Cluster %s/%s: %w", ConditionType, c.Namespace, c.Name, err)
	}
	return nil
}
