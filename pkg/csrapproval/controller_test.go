package csrapproval

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	_ "github.com/autonode/karpenter-clusterapi/pkg/apis" // Cluster API types in scheme.Scheme
	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// One real API server serves as both the management and the workload
// cluster: the controller reads Machines and KubeadmConfigs from the hub,
// requests, Nodes and NodeClaims from the spoke.
var apiServer *environment.Cluster

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	log.SetLogger(logr.Discard())
	hubCRDs, err := environment.HubCRDs()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	spokeCRDs, err := environment.SpokeCRDs()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Only the kinds the approver reads: fewer CRDs, a faster start.
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, crd := range append(hubCRDs, spokeCRDs...) {
		switch crd.Name {
		case "machines.cluster.x-k8s.io", "machinedeployments.cluster.x-k8s.io", "kubeadmconfigs.bootstrap.cluster.x-k8s.io", "nodeclaims.karpenter.sh":
			crds = append(crds, crd)
		}
	}
	if apiServer, err = environment.Start("csrapproval", crds); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = apiServer.Stop() }()
	// Anyone may file a request, as system:node-bootstrapper lets
	// bootstrappers and nodes: the approver decides who gets one.
	if err := apiServer.Client.Create(context.Background(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "csrapproval-test-requesters"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node-bootstrapper"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}},
	}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// rig is a controller on the test API server: a hub scoped to a namespace
// of the test's own, the spoke's cache with the controller's indexes.
type rig struct {
	t     *testing.T
	ns    string
	c     *Controller
	admin client.Client
	spoke cluster.Cluster
	hub   *hub.Hub
	// failApprovals makes that many approvals fail.
	failApprovals atomic.Int32
	// lostReplies makes that many approvals hold on the API server and
	// still fail to the controller (a reply lost to a timeout).
	lostReplies atomic.Int32
	// stale, when set, is what the controller's cached reads return for
	// that request: a cache that has not seen the controller's own write.
	stale atomic.Pointer[certificatesv1.CertificateSigningRequest]
}

func newRig(t *testing.T, policy Policy) *rig {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r := &rig{t: t, ns: fmt.Sprintf("csr-%d", time.Now().UnixNano()%1e9), admin: apiServer.Client}
	if err := r.admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.ns}}); err != nil {
		t.Fatal(err)
	}
	spoke, err := cluster.New(apiServer.Config, func(o *cluster.Options) { o.Scheme = scheme.Scheme })
	if err != nil {
		t.Fatal(err)
	}
	if err := spoke.GetFieldIndexer().IndexField(ctx, &karpv1.NodeClaim{}, nodeClaimProviderIDIndex, func(o client.Object) []string {
		return []string{o.(*karpv1.NodeClaim).Status.ProviderID}
	}); err != nil {
		t.Fatal(err)
	}
	if err := IndexRequests(ctx, spoke.GetFieldIndexer()); err != nil {
		t.Fatal(err)
	}
	h, err := hub.New(apiServer.Config, scheme.Scheme, hub.Scope{Namespace: r.ns})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.SetupIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []cluster.Cluster{spoke, h} {
		go func() { _ = c.Start(ctx) }()
	}
	kube, err := client.NewWithWatch(apiServer.Config, client.Options{Scheme: scheme.Scheme, Cache: &client.CacheOptions{Reader: spoke.GetCache()}})
	if err != nil {
		t.Fatal(err)
	}
	failing := interceptor.NewClient(kube, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if s, ok := obj.(*certificatesv1.CertificateSigningRequest); ok {
				if old := r.stale.Load(); old != nil && old.Name == key.Name {
					old.DeepCopyInto(s)
					return nil
				}
			}
			return c.Get(ctx, key, obj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			if sub == "approval" && r.failApprovals.Add(-1) >= 0 {
				return apierrors.NewServiceUnavailable("approval fails (test)")
			}
			if sub == "approval" && r.lostReplies.Add(-1) >= 0 {
				if err := c.SubResource(sub).Update(ctx, obj, opts...); err != nil {
					return err
				}
				return apierrors.NewTimeoutError("the reply was lost (test)", 1)
			}
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	})
	r.spoke, r.hub = spoke, h
	r.c = NewController(failing, spoke.GetAPIReader(), h, hub.NewLookup(h, nil), policy)
	if !spoke.GetCache().WaitForCacheSync(ctx) || !h.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("caches did not sync")
	}
	return r
}

// eventually waits (10 s at most) for cond.
func (r *rig) eventually(what string, cond func() bool) {
	r.t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	r.t.Fatalf("timed out waiting for %s", what)
}

// machine creates a Karpenter Machine bound to NodeClaim claim, reporting
// host and ip, bootstrapped from a KubeadmConfig with token (none when
// token is "", no KubeadmConfig at all when token is "-"), and its
// launched NodeClaim. It returns the Machine.
func (r *rig) machine(name, claim, host, ip, token string) *clusterv1.Machine {
	r.t.Helper()
	ctx := context.Background()
	providerID := "aws:///us-east-1a/i-" + name
	if token != "-" {
		cfg := &bootstrapv1.KubeadmConfig{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: name}}
		cfg.Spec.JoinConfiguration.Discovery.BootstrapToken.Token = token
		if err := r.admin.Create(ctx, cfg); err != nil {
			r.t.Fatal(err)
		}
	}
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: name,
			Labels:      map[string]string{clusterv1.ClusterNameLabel: "c1", v1alpha1.KarpenterMemberLabel: ""},
			Annotations: map[string]string{v1alpha1.NodeClaimAnnotation: claim}},
		Spec: clusterv1.MachineSpec{ClusterName: "c1", ProviderID: providerID,
			Bootstrap:         clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{APIGroup: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfig", Name: name}},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "AWSMachine", Name: name}},
	}
	if err := r.admin.Create(ctx, m); err != nil {
		r.t.Fatal(err)
	}
	m.Status.Addresses = clusterv1.MachineAddresses{{Type: clusterv1.MachineInternalDNS, Address: host}, {Type: clusterv1.MachineInternalIP, Address: ip}}
	if err := r.admin.Status().Update(ctx, m); err != nil {
		r.t.Fatal(err)
	}
	nc := &karpv1.NodeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claim, Annotations: map[string]string{v1alpha1.MachineAnnotation: r.ns + "/" + name}},
		Spec: karpv1.NodeClaimSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: v1alpha1.Group, Kind: "ClusterAPINodeClass", Name: "default"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{{Key: corev1.LabelOSStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"linux"}}},
		},
	}
	if err := r.admin.Create(ctx, nc); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = r.admin.Delete(context.Background(), nc) })
	nc.Status.ProviderID = providerID
	if err := r.admin.Status().Update(ctx, nc); err != nil {
		r.t.Fatal(err)
	}
	r.eventually("the caches to see Machine "+name+" and NodeClaim "+claim, func() bool {
		got, err := hub.NewLookup(r.hub, nil).ByHostname(ctx, host)
		seen := &karpv1.NodeClaim{}
		return err == nil && len(got) == 1 && r.spoke.GetCache().Get(ctx, types.NamespacedName{Name: claim}, seen) == nil && seen.Status.ProviderID != ""
	})
	return m
}

// request files a request as user and waits for the cache to hold it.
func (r *rig) request(name, user string, groups []string, signer string, tmpl x509.CertificateRequest) *certificatesv1.CertificateSigningRequest {
	r.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		r.t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &tmpl, key)
	if err != nil {
		r.t.Fatal(err)
	}
	usage := certificatesv1.UsageClientAuth
	if signer == certificatesv1.KubeletServingSignerName {
		usage = certificatesv1.UsageServerAuth
	}
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certificatesv1.CertificateSigningRequestSpec{SignerName: signer, Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, usage},
			Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})},
	}
	cfg := rest.CopyConfig(apiServer.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:authenticated")}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	created, err := cs.CertificatesV1().CertificateSigningRequests().Create(context.Background(), csr, metav1.CreateOptions{})
	if err != nil {
		r.t.Fatalf("creating request %s as %s: %v", name, user, err)
	}
	r.t.Cleanup(func() { _ = r.admin.Delete(context.Background(), created) })
	r.eventually("the cache to see request "+name, func() bool {
		return r.spoke.GetCache().Get(context.Background(), types.NamespacedName{Name: name}, &certificatesv1.CertificateSigningRequest{}) == nil
	})
	return created
}

func (r *rig) reconcile(name string) error {
	_, err := r.c.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
	return err
}

func (r *rig) approved(name string) bool {
	csr := &certificatesv1.CertificateSigningRequest{}
	if err := r.admin.Get(context.Background(), types.NamespacedName{Name: name}, csr); err != nil {
		r.t.Fatal(err)
	}
	return approvedCondition(csr)
}

func (r *rig) record(claim string) string {
	nc := &karpv1.NodeClaim{}
	if err := r.admin.Get(context.Background(), types.NamespacedName{Name: claim}, nc); err != nil {
		r.t.Fatal(err)
	}
	return nc.Annotations[v1alpha1.KubeletClientCSRAnnotation]
}

func (r *rig) refusedAs(name string) string {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return r.c.refused[name]
}

var tokenGroups = []string{BootstrappersGroup, "system:bootstrappers:kubeadm:default-node-token"}

// The attacker's client request, with a bootstrap token that is not the
// Machine's, comes first and is refused; the kubelet's, with the token of
// the Machine's KubeadmConfig, is approved and recorded on the NodeClaim.
func TestControllerBindsClientRequestsToTheMachinesToken(t *testing.T) {
	r := newRig(t, Policy{})
	host := "ip-10-1-0-1.ec2.internal"
	r.machine("m-bind", "claim-bind", host, "10.1.0.1", "kub3lt.0123456789abcdef")
	attacker := r.request("bind-attacker", "system:bootstrap:att4ck", tokenGroups, certificatesv1.KubeAPIServerClientKubeletSignerName, x509.CertificateRequest{Subject: subject(host)})
	if err := r.reconcile(attacker.Name); err != nil {
		t.Fatal(err)
	}
	if r.approved(attacker.Name) || r.refusedAs(attacker.Name) != ReasonNotTheMachinesToken {
		t.Fatalf("attacker's request: approved %v, refused as %q; want refused as %s", r.approved(attacker.Name), r.refusedAs(attacker.Name), ReasonNotTheMachinesToken)
	}
	kubelet := r.request("bind-kubelet", "system:bootstrap:kub3lt", tokenGroups, certificatesv1.KubeAPIServerClientKubeletSignerName, x509.CertificateRequest{Subject: subject(host)})
	if err := r.reconcile(kubelet.Name); err != nil {
		t.Fatal(err)
	}
	if !r.approved(kubelet.Name) || r.record("claim-bind") != kubelet.Name {
		t.Fatalf("kubelet's request: approved %v, recorded %q; want approved and recorded", r.approved(kubelet.Name), r.record("claim-bind"))
	}
	if err := r.reconcile(attacker.Name); err != nil || r.approved(attacker.Name) {
		t.Fatalf("attacker's request approved on a second look (%v)", err)
	}
}

// An approval that fails leaves no record on the NodeClaim: the next
// attempt, or the kubelet's next request, is not refused as
// ClientAlreadyApproved.
func TestControllerRecordOnlySurvivesASuccessfulApproval(t *testing.T) {
	r := newRig(t, Policy{})
	host := "ip-10-1-0-2.ec2.internal"
	r.machine("m-rec", "claim-rec", host, "10.1.0.2", "")
	csr := r.request("rec-kubelet", bootUser, tokenGroups, certificatesv1.KubeAPIServerClientKubeletSignerName, x509.CertificateRequest{Subject: subject(host)})
	r.failApprovals.Store(1)
	if err := r.reconcile(csr.Name); err == nil {
		t.Fatal("the approval was to fail")
	}
	if got := r.record("claim-rec"); got != "" || r.approved(csr.Name) {
		t.Fatalf("after a failed approval NodeClaim records %q (approved %v), want no record", got, r.approved(csr.Name))
	}
	r.eventually("the cache to see the record removed", func() bool {
		nc := &karpv1.NodeClaim{}
		return r.spoke.GetCache().Get(context.Background(), types.NamespacedName{Name: "claim-rec"}, nc) == nil && nc.Annotations[v1alpha1.KubeletClientCSRAnnotation] == ""
	})
	if err := r.reconcile(csr.Name); err != nil {
		t.Fatal(err)
	}
	if !r.approved(csr.Name) || r.record("claim-rec") != csr.Name {
		t.Fatalf("the retry: approved %v, recorded %q", r.approved(csr.Name), r.record("claim-rec"))
	}
}

// A request approved a moment ago that the cache still shows pending is
// looked at again (any event on it, or its node, queues it): the record of
// its approval stays. Without the live look the second approval conflicts
// and its rollback removed the record of the request that was approved,
// so the NodeClaim no longer said which client certificate it got (seen
// in TestKubeletCSRApproval under load).
func TestControllerKeepsTheRecordOfARequestTheCacheShowsPending(t *testing.T) {
	r := newRig(t, Policy{})
	host := "ip-10-1-0-9.ec2.internal"
	r.machine("m-stale", "claim-stale", host, "10.1.0.9", "")
	csr := r.request("stale-kubelet", bootUser, tokenGroups, certificatesv1.KubeAPIServerClientKubeletSignerName, x509.CertificateRequest{Subject: subject(host)})
	if err := r.reconcile(csr.Name); err != nil {
		t.Fatal(err)
	}
	if !r.approved(csr.Name) || r.record("claim-stale") != csr.Name {
		t.Fatalf("first look: approved %v, recorded %q", r.approved(csr.Name), r.record("claim-stale"))
	}
	r.eventually("the cache to see the record", func() bool {
		nc := &karpv1.NodeClaim{}
		return r.spoke.GetCache().Get(context.Background(), types.NamespacedName{Name: "claim-stale"}, nc) == nil && nc.Annotations[v1alpha1.KubeletClientCSRAnnotation] == csr.Name
	})
	r.stale.Store(csr.DeepCopy()) // as created: pending
	defer r.stale.Store(nil)
	if err := r.reconcile(csr.Name); err != nil {
		t.Fatalf("second look at an approved request: %v", err)
	}
	if got := r.record("claim-stale"); got != csr.Name || !r.approved(csr.Name) {
		t.Fatalf("after a second look with a stale cache NodeClaim records %q (approved %v), want %s", got, r.approved(csr.Name), csr.Name)
	}
}

// An approval that holds on the API server though its reply was lost
// keeps its record: the NodeClaim still says which client certificate it
// got, and the retry sees the request decided.
func TestControllerKeepsTheRecordOfAnApprovalWhoseReplyWasLost(t *testing.T) {
	r := newRig(t, Policy{})
	host := "ip-10-1-0-10.ec2.internal"
	r.machine("m-lost", "claim-lost", host, "10.1.0.10", "")
	csr := r.request("lost-kubelet", bootUser, tokenGroups, certificatesv1.KubeAPIServerClientKubeletSignerName, x509.CertificateRequest{Subject: subject(host)})
	r.lostReplies.Store(1)
	if err := r.reconcile(csr.Name); err == nil {
		t.Fatal("the approval's reply was to be lost")
	}
	if got := r.record("claim-lost"); got != csr.Name || !r.approved(csr.Name) {
		t.Fatalf("after an approval whose reply was lost NodeClaim records %q (approved %v), want %s", got, r.approved(csr.Name), csr.Name)
	}
	r.eventually("the cache to see the approval", func() bool {
		seen := &certificatesv1.CertificateSigningRequest{}
		return r.spoke.GetCache().Get(context.Background(), types.NamespacedName{Name: csr.Name}, seen) == nil && approvedCondition(seen)
	})
	if err := r.reconcile(csr.Name); err != nil || r.record("claim-lost") != csr.Name {
		t.Fatalf("the retry: %v, recorded %q", err, r.record("claim-lost"))
	}
}

// A refused request that someone else approves or denies leaves the
// refusal memory: its update event reaches the controller, which forgets it.
func TestControllerForgetsRequestsDecidedElsewhere(t *testing.T) {
	r := newRig(t, Policy{})
	host := "ip-10-1-0-3.ec2.internal"
	r.machine("m-forget", "claim-forget", host, "10.1.0.3", "")
	csr := r.request("forget-alice", "alice", []string{"developers"}, certificatesv1.KubeAPIServerClientKubeletSignerName, x509.CertificateRequest{Subject: subject(host)})
	if err := r.reconcile(csr.Name); err != nil {
		t.Fatal(err)
	}
	if r.refusedAs(csr.Name) != ReasonIdentity {
		t.Fatalf("alice's request refused as %q, want %s", r.refusedAs(csr.Name), ReasonIdentity)
	}
	old := &certificatesv1.CertificateSigningRequest{}
	if err := r.admin.Get(context.Background(), client.ObjectKeyFromObject(csr), old); err != nil {
		t.Fatal(err)
	}
	decided := old.DeepCopy()
	decided.Status.Conditions = append(decided.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: "Human", LastUpdateTime: metav1.Now()})
	if err := r.admin.SubResource("approval").Update(context.Background(), decided); err != nil {
		t.Fatal(err)
	}
	if !decidedOrPending().Update(event.UpdateEvent{ObjectOld: old, ObjectNew: decided}) {
		t.Fatal("the update that decides a pending request does not reach the controller")
	}
	r.eventually("the cache to see the denial", func() bool {
		got := &certificatesv1.CertificateSigningRequest{}
		return r.spoke.GetCache().Get(context.Background(), client.ObjectKeyFromObject(csr), got) == nil && !pending(got)
	})
	if err := r.reconcile(csr.Name); err != nil {
		t.Fatal(err)
	}
	if got := r.refusedAs(csr.Name); got != "" {
		t.Fatalf("the refusal of a request denied by someone else is remembered (%q)", got)
	}
}

// What the controller gathers for a client request: the Machine's
// creation and token, a missing KubeadmConfig, the other pending requests,
// the state of the recorded request, and the SubjectAccessReview's answer.
func TestControllerGathersClientFacts(t *testing.T) {
	r := newRig(t, Policy{SubjectAccessReview: true})
	ctx := context.Background()
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "csr-facts-nodeclient-" + r.ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:certificates.k8s.io:certificatesigningrequests:nodeclient"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:bootstrappers:kubeadm:default-node-token"}},
	}
	if err := r.admin.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.admin.Delete(context.Background(), binding) })

	host, lone := "ip-10-1-0-4.ec2.internal", "ip-10-1-0-5.ec2.internal"
	m := r.machine("m-facts", "claim-facts", host, "10.1.0.4", "fact5s.0123456789abcdef")
	r.machine("m-noconfig", "claim-noconfig", lone, "10.1.0.5", "-")
	first := r.request("facts-1", "system:bootstrap:fact5s", tokenGroups, certificatesv1.KubeAPIServerClientKubeletSignerName, x509.CertificateRequest{Subject: subject(host)})
	second := r.request("facts-2", "system:serviceaccount:tenant:node-bootstrapper", []string{ServiceAccountsGroup}, certificatesv1.KubeAPIServerClientKubeletSignerName, x509.CertificateRequest{Subject: subject(host)})

	f, err := r.c.facts(ctx, ReadRequest(first))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Machines) != 1 {
		t.Fatalf("facts name %d Machines, want 1", len(f.Machines))
	}
	got := f.Machines[0]
	if got.Machine.BootstrapTokenID != "fact5s" || !got.Machine.Created.Equal(m.CreationTimestamp.Time) || got.NodeClaim == nil || !got.NodeClaim.Launched {
		t.Fatalf("Machine facts %+v, NodeClaim %+v: want token fact5s, created %s, a launched NodeClaim", got.Machine, got.NodeClaim, m.CreationTimestamp)
	}
	if len(f.Others) != 1 || f.Others[0].Name != second.Name {
		t.Fatalf("other pending requests %v, want [%s]", f.Others, second.Name)
	}
	if !f.Authorized[first.Name] || f.Authorized[second.Name] {
		t.Fatalf("SubjectAccessReview answers %v: want %s allowed (kubeadm's token group is bound to nodeclient), %s not", f.Authorized, first.Name, second.Name)
	}

	// A recorded request that is gone binds nothing; one approved does.
	nc := &karpv1.NodeClaim{}
	if err := r.admin.Get(ctx, types.NamespacedName{Name: "claim-facts"}, nc); err != nil {
		t.Fatal(err)
	}
	nc.Annotations[v1alpha1.KubeletClientCSRAnnotation] = "facts-gone"
	if err := r.admin.Update(ctx, nc); err != nil {
		t.Fatal(err)
	}
	r.eventually("the cache to see the record", func() bool {
		seen, err := r.c.nodeClaim(ctx, "claim-facts")
		return err == nil && seen != nil && seen.ApprovedClientCSR == "facts-gone"
	})
	if f, err = r.c.facts(ctx, ReadRequest(first)); err != nil || f.Machines[0].NodeClaim.ApprovedClientCSRState != RecordVoid {
		t.Fatalf("record of a request that does not exist: state %q (%v), want %s", f.Machines[0].NodeClaim.ApprovedClientCSRState, err, RecordVoid)
	}
	// ... and is replaced when a request is approved.
	if err := r.c.recordClientApproval(ctx, "claim-facts", first.Name); err != nil || r.record("claim-facts") != first.Name {
		t.Fatalf("recording %s over a void record: %v, record %q", first.Name, err, r.record("claim-facts"))
	}

	f, err = r.c.facts(ctx, ReadRequest(r.request("facts-lone", "system:bootstrap:fact5s", tokenGroups, certificatesv1.KubeAPIServerClientKubeletSignerName, x509.CertificateRequest{Subject: subject(lone)})))
	if err != nil || len(f.Machines) != 1 || f.Machines[0].Machine.BootstrapMissing == "" {
		t.Fatalf("a Machine whose KubeadmConfig does not exist: facts %+v (%v), want BootstrapMissing", f.Machines, err)
	}
}

// A node that writes another Machine's providerID on a Node of its own,
// before that Machine's NodeClaim registered, is found to be that
// NodeClaim's, and refused a serving certificate with the Machine's names.
func TestControllerServingRequestOfAForeignNode(t *testing.T) {
	r := newRig(t, Policy{})
	ctx := context.Background()
	host, evil := "ip-10-1-0-6.ec2.internal", "evil-node"
	m := r.machine("m-serve", "claim-serve", host, "10.1.0.6", "")
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: evil}, Spec: corev1.NodeSpec{ProviderID: m.Spec.ProviderID}}
	if err := r.admin.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.admin.Delete(context.Background(), node) })
	r.eventually("the cache to see Node "+evil, func() bool {
		return r.spoke.GetCache().Get(ctx, types.NamespacedName{Name: evil}, &corev1.Node{}) == nil
	})
	csr := r.request("serve-evil", NodeUserPrefix+evil, []string{NodesGroup}, certificatesv1.KubeletServingSignerName,
		x509.CertificateRequest{Subject: subject(evil), DNSNames: []string{host}, IPAddresses: []net.IP{net.ParseIP("10.1.0.6")}})
	if err := r.reconcile(csr.Name); err != nil {
		t.Fatal(err)
	}
	if r.approved(csr.Name) || r.refusedAs(csr.Name) != ReasonNameNotOnMachine {
		t.Fatalf("serving request of node %s with Machine %s's names: approved %v, refused as %q; want refused as %s", evil, m.Name, r.approved(csr.Name), r.refusedAs(csr.Name), ReasonNameNotOnMachine)
	}
}
