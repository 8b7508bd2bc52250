package autonode

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// The Reconciler against a real API server that is both the management
// cluster and the Clusters' workload cluster (their kubeconfig Secrets
// point at it): each step is one Reconcile, as the manager would call it.
func TestReconcilerAgainstAnAPIServer(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set (make test sets it)")
	}
	hubCRDs, err := environment.HubCRDs()
	if err != nil {
		t.Fatal(err)
	}
	spokeCRDs, err := environment.SpokeCRDs()
	if err != nil {
		t.Fatal(err)
	}
	api, err := environment.Start("autonode", append(hubCRDs, spokeCRDs...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Stop() })
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewWithWatch(api.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := environment.KubeconfigBytes(api.Config, "workload")
	if err != nil {
		t.Fatal(err)
	}
	events := record.NewFakeRecorder(100)
	r := &Reconciler{Client: c, APIReader: c, Config: testConfig, Recorder: events, Workload: NewWorkloadClient, Now: time.Now}
	e := &env{t: t, c: c, wl: api.Client, r: r, events: events, kubeconfig: kubeconfig}

	t.Run("opt in, settings, version, malformed", e.optInLifecycle)
	t.Run("hand-installed provider", e.handInstalled)
	t.Run("opt out removes the nodes first", e.optOut)
	t.Run("opt out keeping the nodes", e.optOutKeepingNodes)
	t.Run("a removal that fails half way is finished later", e.removalRetried)
	t.Run("the provider's workload identity", func(t *testing.T) { e.workloadIdentity(t, api.Config) })
	t.Run("a Cluster being deleted is left alone", e.deletingLeftAlone)
}

// Deleting the Cluster never waits on Karpenter: AutoNode puts no finalizer
// on it and, once it is being deleted, writes nothing (its objects go with
// the Cluster by their owner references).
func (e *env) deletingLeftAlone(t *testing.T) {
	ctx := context.Background()
	cl := e.cluster(t, "team-d", "gone", map[string]string{EnabledLabel: Enabled})
	e.initialize(t, cl)
	e.reconcile(t, cl)
	if f := e.get(t, cl).Finalizers; len(f) > 0 {
		t.Errorf("AutoNode put finalizers %v on the Cluster", f)
	}
	// Another controller's finalizer keeps the deleted Cluster visible.
	cur := e.get(t, cl)
	cur.Finalizers = []string{"test.example/hold"}
	if err := e.c.Update(ctx, cur); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cur := e.get(t, cl)
		cur.Finalizers = nil
		_ = e.c.Update(context.Background(), cur)
	})
	if err := e.c.Delete(ctx, cur); err != nil {
		t.Fatal(err)
	}
	dep := e.deployment(t, cl)
	e.setMetadata(t, cl, map[string]string{EnabledLabel: Disabled}, nil) // even an opt-out now
	before := e.get(t, cl)
	if res := e.reconcile(t, cl); res.RequeueAfter != 0 {
		t.Errorf("requeued a Cluster being deleted after %s", res.RequeueAfter)
	}
	after := e.get(t, cl)
	if after.ResourceVersion != before.ResourceVersion || len(after.Finalizers) != 1 {
		t.Errorf("AutoNode wrote to a Cluster being deleted: resourceVersion %s→%s, finalizers %v", before.ResourceVersion, after.ResourceVersion, after.Finalizers)
	}
	if d := e.deployment(t, cl); d.ResourceVersion != dep.ResourceVersion || !d.DeletionTimestamp.IsZero() {
		t.Errorf("AutoNode touched the provider of a Cluster being deleted: %s→%s", dep.ResourceVersion, d.ResourceVersion)
	}
	for _, ref := range dep.OwnerReferences {
		if ref.UID == cl.UID && ptr.Deref(ref.BlockOwnerDeletion, false) {
			t.Error("the provider blocks its Cluster's deletion")
		}
	}
}

// The provider's identity in the workload cluster: its token authenticates
// as kube-system/karpenter-clusterapi, is kept until half its lifetime is
// gone and then renewed (the reconcile comes back in time); the CSR
// approver's binding follows the setting; opting out removes them all.
func (e *env) workloadIdentity(t *testing.T, cfg *rest.Config) {
	ctx := context.Background()
	cl := e.cluster(t, "team-w", "ident", map[string]string{EnabledLabel: Enabled})
	e.setMetadata(t, cl, nil, map[string]string{ApproveKubeletCSRsAnnotation: "true"})
	e.initialize(t, cl)
	res := e.reconcile(t, cl)
	if res.RequeueAfter < 29*time.Minute || res.RequeueAfter > TokenLifetime/2 {
		t.Errorf("requeue after %s, want the token's renewal, about %s", res.RequeueAfter, TokenLifetime/2)
	}
	secret := func() *corev1.Secret {
		s := &corev1.Secret{}
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: "team-w", Name: "ident-karpenter-workload"}, s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	first := secret()
	as := rest.CopyConfig(cfg)
	as.CertData, as.KeyData, as.BearerToken = nil, nil, string(first.Data["token"])
	who, err := kubernetes.NewForConfig(as)
	if err != nil {
		t.Fatal(err)
	}
	review, err := who.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := review.Status.UserInfo.Username; u != "system:serviceaccount:kube-system:karpenter-clusterapi" {
		t.Errorf("the token Secret's token is %s's", u)
	}
	if kc := string(first.Data["kubeconfig"]); !strings.Contains(kc, "tokenFile: "+SpokeKubeconfigDir+"/token") || !strings.Contains(kc, cfg.Host) {
		t.Errorf("workload kubeconfig:\n%s", kc)
	}
	crb := &rbacv1.ClusterRoleBinding{}
	if err := e.wl.Get(ctx, client.ObjectKey{Name: "karpenter-clusterapi-csr-approver"}, crb); err != nil || crb.Labels[ManagedByLabel] != ManagedBy {
		t.Errorf("CSR approver binding with approve-kubelet-csrs=true: %v %v", err, crb.Labels)
	}

	e.reconcile(t, cl)
	if again := secret(); string(again.Data["token"]) != string(first.Data["token"]) {
		t.Error("a fresh token was renewed")
	}
	e.r.Now = func() time.Time { return time.Now().Add(TokenLifetime/2 + time.Minute) }
	t.Cleanup(func() { e.r.Now = time.Now })
	e.reconcile(t, cl)
	if renewed := secret(); string(renewed.Data["token"]) == string(first.Data["token"]) {
		t.Error("the token was not renewed after half its lifetime")
	}
	e.r.Now = time.Now

	e.setMetadata(t, cl, nil, map[string]string{ApproveKubeletCSRsAnnotation: "false"})
	e.reconcile(t, cl)
	if err := e.wl.Get(ctx, client.ObjectKey{Name: "karpenter-clusterapi-csr-approver"}, &rbacv1.ClusterRoleBinding{}); !apierrors.IsNotFound(err) {
		t.Errorf("CSR approver binding after approve-kubelet-csrs=false: %v", err)
	}

	e.setMetadata(t, cl, map[string]string{EnabledLabel: Disabled}, map[string]string{OnDisableAnnotation: KeepNodes})
	e.want(t, cl, ReasonDisabled, "nodes kept")
	for _, o := range []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: WorkloadNamespace, Name: WorkloadServiceAccount}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "karpenter-clusterapi-core"}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "karpenter-clusterapi-workload"}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-node-lease", Name: "karpenter-clusterapi-node-lease"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-w", Name: "ident-karpenter-workload"}},
	} {
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(o), o); !apierrors.IsNotFound(err) {
			t.Errorf("%T %s after opting out: %v", o, client.ObjectKeyFromObject(o), err)
		}
	}
}

type env struct {
	t          *testing.T
	c          client.Client
	wl         client.Client // the workload cluster's objects (Karpenter's kinds)
	r          *Reconciler
	events     *record.FakeRecorder
	kubeconfig []byte
}

func (e *env) cluster(t *testing.T, ns, name string, labels map[string]string) *clusterv1.Cluster {
	t.Helper()
	ctx := context.Background()
	if err := client.IgnoreAlreadyExists(e.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})); err != nil {
		t.Fatal(err)
	}
	cl := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: clusterv1.ClusterSpec{
			ControlPlaneRef:   clusterv1.ContractVersionedObjectReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: name},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "AWSCluster", Name: name},
		},
	}
	if err := e.c.Create(ctx, cl); err != nil {
		t.Fatal(err)
	}
	return cl
}

func (e *env) initialize(t *testing.T, cl *clusterv1.Cluster) {
	t.Helper()
	ctx := context.Background()
	cur := e.get(t, cl)
	cur.Status.Initialization.ControlPlaneInitialized = ptr.To(true)
	if err := e.c.Status().Update(ctx, cur); err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: cl.Namespace, Name: cl.Name + "-kubeconfig", Labels: map[string]string{clusterv1.ClusterNameLabel: cl.Name}},
		Data:       map[string][]byte{"value": e.kubeconfig},
	}
	if err := e.c.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
}

func (e *env) get(t *testing.T, cl *clusterv1.Cluster) *clusterv1.Cluster {
	t.Helper()
	cur := &clusterv1.Cluster{}
	if err := e.c.Get(context.Background(), client.ObjectKeyFromObject(cl), cur); err != nil {
		t.Fatal(err)
	}
	return cur
}

func (e *env) reconcile(t *testing.T, cl *clusterv1.Cluster) reconcile.Result {
	t.Helper()
	res, err := e.r.Reconcile(log.IntoContext(context.Background(), logr.Discard()), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: cl.Namespace, Name: cl.Name}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// want reconciles and checks the Cluster's condition.
func (e *env) want(t *testing.T, cl *clusterv1.Cluster, reason, inMessage string) metav1.Condition {
	t.Helper()
	e.reconcile(t, cl)
	cond := currentCondition(e.get(t, cl))
	if cond == nil || cond.Reason != reason || !strings.Contains(cond.Message, inMessage) {
		t.Fatalf("Cluster %s/%s: condition %+v, want reason %s with %q", cl.Namespace, cl.Name, cond, reason, inMessage)
	}
	return *cond
}

func (e *env) deployment(t *testing.T, cl *clusterv1.Cluster) *appsv1.Deployment {
	t.Helper()
	d := &appsv1.Deployment{}
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: cl.Namespace, Name: ObjectName(cl)}, d); err != nil {
		t.Fatal(err)
	}
	return d
}

func (e *env) markAvailable(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	d.Status = appsv1.DeploymentStatus{ObservedGeneration: d.Generation, Replicas: *d.Spec.Replicas, UpdatedReplicas: *d.Spec.Replicas, ReadyReplicas: *d.Spec.Replicas, AvailableReplicas: *d.Spec.Replicas}
	if err := e.c.Status().Update(context.Background(), d); err != nil {
		t.Fatal(err)
	}
}

func (e *env) setMetadata(t *testing.T, cl *clusterv1.Cluster, labels, annotations map[string]string) {
	t.Helper()
	cur := e.get(t, cl)
	patch := client.MergeFrom(cur.DeepCopy())
	for k, v := range labels {
		if cur.Labels == nil {
			cur.Labels = map[string]string{}
		}
		if v == "" {
			delete(cur.Labels, k)
		} else {
			cur.Labels[k] = v
		}
	}
	for k, v := range annotations {
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		if v == "" {
			delete(cur.Annotations, k)
		} else {
			cur.Annotations[k] = v
		}
	}
	if err := e.c.Patch(context.Background(), cur, patch); err != nil {
		t.Fatal(err)
	}
}

func (e *env) optInLifecycle(t *testing.T) {
	untouched := e.cluster(t, "team-x", "plain", nil)
	e.reconcile(t, untouched)
	if cond := currentCondition(e.get(t, untouched)); cond != nil {
		t.Errorf("a Cluster that never opted in got a condition: %+v", cond)
	}

	cl := e.cluster(t, "team-a", "prod", map[string]string{EnabledLabel: Enabled})
	e.want(t, cl, ReasonWaitingForControlPlane, "team-a/prod")
	e.initialize(t, cl)
	e.want(t, cl, ReasonStarting, "0/1")
	d := e.deployment(t, cl)
	if d.Annotations[VersionAnnotation] != testConfig.Version || len(d.ManagedFields) == 0 || d.ManagedFields[0].Manager != FieldOwner {
		t.Errorf("deployment not applied by %s at %s: %v %v", FieldOwner, testConfig.Version, d.Annotations, d.ManagedFields)
	}
	e.markAvailable(t, d)
	cond := e.want(t, cl, ReasonRunning, testConfig.Image)
	if cond.Status != metav1.ConditionTrue || !strings.Contains(cond.Message, "AutoNode "+testConfig.Version) {
		t.Errorf("running condition %+v", cond)
	}
	for _, o := range []client.Object{&corev1.ServiceAccount{}, &rbacv1.RoleBinding{}, &corev1.ConfigMap{}} {
		if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: "team-a", Name: "prod-karpenter"}, o); err != nil {
			t.Errorf("%T: %v", o, err)
		}
	}

	// A setting changes the Deployment; so does a new controller version.
	e.setMetadata(t, cl, nil, map[string]string{ReplicasAnnotation: "2"})
	e.reconcile(t, cl)
	if d := e.deployment(t, cl); *d.Spec.Replicas != 2 {
		t.Errorf("replicas %d after the setting", *d.Spec.Replicas)
	}
	e.r.Config.Version, e.r.Config.Image = "v1.3.0", "ghcr.io/autonode/karpenter-clusterapi:v1.3.0"
	t.Cleanup(func() { e.r.Config = testConfig })
	e.reconcile(t, cl)
	upgraded := e.deployment(t, cl)
	if upgraded.Annotations[VersionAnnotation] != "v1.3.0" || upgraded.Spec.Template.Spec.Containers[0].Image != e.r.Config.Image {
		t.Errorf("not upgraded: %v %s", upgraded.Annotations, upgraded.Spec.Template.Spec.Containers[0].Image)
	}

	// Malformed: reported, names the Cluster and field, changes nothing.
	e.setMetadata(t, cl, nil, map[string]string{ReplicasAnnotation: "many"})
	before := e.deployment(t, cl)
	e.want(t, cl, ReasonInvalidSetting, ReplicasAnnotation)
	if after := e.deployment(t, cl); after.ResourceVersion != before.ResourceVersion {
		t.Error("a malformed setting changed the running provider")
	}
	if !e.sawEvent(corev1.EventTypeWarning, ReasonInvalidSetting, "team-a/prod") {
		t.Error("no Warning event naming the Cluster")
	}
	e.setMetadata(t, cl, nil, map[string]string{ReplicasAnnotation: "1"})
	e.reconcile(t, cl)
}

func (e *env) sawEvent(kind, reason, text string) bool {
	for {
		select {
		case ev := <-e.events.Events:
			if strings.HasPrefix(ev, kind+" AutoNode"+reason) && strings.Contains(ev, text) {
				return true
			}
		default:
			return false
		}
	}
}

func (e *env) handInstalled(t *testing.T) {
	ctx := context.Background()
	cl := e.cluster(t, "team-b", "shared", map[string]string{EnabledLabel: Enabled})
	e.initialize(t, cl)
	handInstalled := func(name, clusterArg string) *appsv1.Deployment {
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: name, Labels: map[string]string{nameLabel: providerName}},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](0),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x", Args: []string{"--cluster-api-cluster-name=" + clusterArg}}}},
				},
			},
		}
		if err := e.c.Create(ctx, d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	other := handInstalled("for-another-cluster", "other")
	mine := handInstalled("by-hand", "shared")
	e.want(t, cl, ReasonHandInstalledProvider, "Deployment team-b/by-hand in the management cluster")
	err := e.c.Get(ctx, client.ObjectKey{Namespace: "team-b", Name: ObjectName(cl)}, &appsv1.Deployment{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("a second provider was created: %v", err)
	}
	for _, d := range []*appsv1.Deployment{mine, other} {
		if err := e.c.Delete(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	e.want(t, cl, ReasonStarting, "team-b/shared")
	// Leave it off for the next scenarios, keeping nothing behind.
	e.setMetadata(t, cl, nil, map[string]string{OnDisableAnnotation: KeepNodes})
	e.setMetadata(t, cl, map[string]string{EnabledLabel: ""}, nil)
	e.want(t, cl, ReasonDisabled, "nodes kept")
}

func nodePool(name string) *karpv1.NodePool {
	return &karpv1.NodePool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: karpv1.NodePoolSpec{Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.cluster.x-k8s.io", Kind: "ClusterAPINodeClass", Name: "default"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: corev1.LabelOSStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"linux"}}},
		}}},
	}
}

func (e *env) optOut(t *testing.T) {
	ctx := context.Background()
	cl := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "prod"}}
	pool := nodePool("general")
	if err := e.wl.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	claim := &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "general-abc", Finalizers: []string{"test/still-terminating"}},
		Spec: karpv1.NodeClaimSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: "karpenter.cluster.x-k8s.io", Kind: "ClusterAPINodeClass", Name: "default"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: corev1.LabelOSStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"linux"}}},
		},
	}
	if err := e.wl.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	e.setMetadata(t, cl, map[string]string{EnabledLabel: Disabled}, nil)
	e.want(t, cl, ReasonRemovingNodes, "deleting 1 NodePools")
	if err := e.wl.Get(ctx, client.ObjectKeyFromObject(pool), &karpv1.NodePool{}); !apierrors.IsNotFound(err) {
		t.Fatalf("NodePool not deleted: %v", err)
	}
	// Core has not terminated the NodeClaim yet: the provider stays.
	e.want(t, cl, ReasonRemovingNodes, "waiting for Karpenter to remove 1 NodeClaims")
	e.deployment(t, cl)
	if err := e.wl.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(claim.DeepCopy())
	claim.Finalizers = nil
	if err := e.wl.Patch(ctx, claim, patch); err != nil {
		t.Fatal(err)
	}
	e.want(t, cl, ReasonDisabled, "nodes removed, then its provider")
	for _, o := range []client.Object{&appsv1.Deployment{}, &corev1.ServiceAccount{}, &rbacv1.RoleBinding{}, &corev1.ConfigMap{}} {
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: "prod-karpenter"}, o); !apierrors.IsNotFound(err) {
			t.Errorf("%T still there: %v", o, err)
		}
	}
}

func (e *env) optOutKeepingNodes(t *testing.T) {
	ctx := context.Background()
	cl := e.cluster(t, "team-c", "keep", map[string]string{EnabledLabel: Enabled})
	e.initialize(t, cl)
	e.want(t, cl, ReasonStarting, "team-c/keep")
	pool := nodePool("kept")
	if err := e.wl.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	e.setMetadata(t, cl, map[string]string{EnabledLabel: ""}, map[string]string{OnDisableAnnotation: KeepNodes})
	e.want(t, cl, ReasonDisabled, "nodes kept")
	if err := e.wl.Get(ctx, client.ObjectKeyFromObject(pool), &karpv1.NodePool{}); err != nil {
		t.Errorf("KeepNodes deleted the NodePool: %v", err)
	}
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: "team-c", Name: "keep-karpenter"}, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
		t.Errorf("provider still there: %v", err)
	}
}

// The API server refuses the ServiceAccount's deletion once: the reconcile
// fails, the provider still counts as there, and the next reconcile removes
// everything. (Deleting the Deployment first left the rest behind for good:
// with no Deployment the Cluster no longer counted as having a provider.)
func (e *env) removalRetried(t *testing.T) {
	ctx := context.Background()
	cl := e.cluster(t, "team-d", "flaky", map[string]string{EnabledLabel: Enabled})
	e.initialize(t, cl)
	e.want(t, cl, ReasonStarting, "team-d/flaky")
	refused := 0
	flaky := interceptor.NewClient(e.c.(client.WithWatch), interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if _, sa := obj.(*corev1.ServiceAccount); sa && refused == 0 {
				refused++
				return apierrors.NewServiceUnavailable("injected: deleting a ServiceAccount")
			}
			return c.Delete(ctx, obj, opts...)
		},
	})
	r := *e.r
	r.Client = flaky
	e.setMetadata(t, cl, map[string]string{EnabledLabel: ""}, map[string]string{OnDisableAnnotation: KeepNodes})
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: cl.Namespace, Name: cl.Name}}
	if _, err := r.Reconcile(log.IntoContext(ctx, logr.Discard()), req); err == nil {
		t.Fatal("reconcile succeeded although a deletion was refused")
	}
	e.deployment(t, cl) // still there: the next reconcile takes the removal up again
	if _, err := r.Reconcile(log.IntoContext(ctx, logr.Discard()), req); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKey{Namespace: cl.Namespace, Name: ObjectName(cl)}
	for _, o := range []client.Object{&appsv1.Deployment{}, &rbacv1.RoleBinding{}, &corev1.ServiceAccount{}, &corev1.ConfigMap{}} {
		if err := e.c.Get(ctx, key, o); !apierrors.IsNotFound(err) {
			t.Errorf("%T %s left behind: %v", o, key, err)
		}
	}
}
