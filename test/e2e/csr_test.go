package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/csrapproval"
	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// Kubelets that join by certificate signing requests (issue 38): the
// world's kubelets ask for their client certificate as a bootstrap token
// and register only once it is approved and signed (kube-controller-
// manager's signer checks it as in any cluster), then ask for a serving
// certificate. Nothing in the world approves them.
//
// With --approve-kubelet-csrs, pods of a MachineDeployment-mode and of a
// Machine-mode NodePool get nodes with no human step: each node's client
// and serving requests are approved by the provider, against the Machine
// that launched it, and forged requests stay pending with an event on the
// NodeClaim they name. Without the flag, the same launches stay
// unregistered, their requests pending, until Karpenter's registration
// timeout replaces them.
func TestKubeletCSRApproval(t *testing.T) {
	ctx := context.Background()
	price := map[string]string{v1alpha1.PriceAnnotation: "0.096"}
	w.SetKubeletJoin(world.JoinWithCSR)
	t.Cleanup(func() { w.SetKubeletJoin(world.JoinDirect) })

	provider.Stop() // the suite's provider runs without the flag: replace it
	cur, err := StartProvider(bin, w, "csr-approval.log", "--approve-kubelet-csrs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpTail(cur.LogPath, 80)
		}
		cur.Stop()
		var err error
		if provider, err = StartProvider(bin, w, "provider.log"); err != nil {
			t.Errorf("restarting the suite's provider: %v", err)
		}
	})

	// Both modes at once, each bootstrapped from a KubeadmConfigTemplate
	// (a token of its own per Machine, as CABPK writes): m5.large has 2
	// CPUs, so 1500m pods take a node each.
	if _, err := w.CreateKubeadmConfigTemplate(ctx, "csr-workers", nil); err != nil {
		t.Fatal(err)
	}
	pool(t, "csr-md")
	kubeletMachineDeployment(t, "csr-md", "csr-md-m5-large", "m5.large", environment.MachineDeploymentOptions{BootstrapTemplate: "csr-workers"})
	machinePool(t, "csr-m", machinePoolOptions{Bootstrap: &v1alpha1.Bootstrap{ConfigRef: &v1alpha1.TemplateReference{
		APIGroup: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfigTemplate", Name: "csr-workers",
	}}})
	memberTemplate(t, "csr-m", "csr-m-m5-large", "m5.large", price)

	// The kubelets boot slowly: the attacker's requests come first.
	w.HoldKubeletJoin(true)
	t.Cleanup(func() { w.HoldKubeletJoin(false) })
	dMD := deployment(t, "csr-md", "app-csr-md", 2, "1500m")
	dM := deployment(t, "csr-m", "app-csr-m", 2, "1500m")
	start := time.Now()
	victims := launchedUnjoined(t, []string{"csr-md", "csr-m"}, 4)
	attacks := attackPendingNodes(t, victims)
	t.Cleanup(func() {
		for _, c := range attacks {
			_ = w.Spoke.Client.Delete(context.Background(), c)
		}
	})
	attacked := time.Now()
	w.HoldKubeletJoin(false)

	if err := WaitFor(ctx, 3*time.Minute, func(ctx context.Context) (bool, error) {
		a, err := readyPods(ctx, "app-csr-md")
		if err != nil {
			return false, err
		}
		b, err := readyPods(ctx, "app-csr-m")
		return a == 2 && b == 2, err
	}); err != nil {
		logCSRs(t)
		t.Fatalf("pods of both pools Ready with CSR-joining kubelets and --approve-kubelet-csrs: %v", err)
	}
	t.Logf("4 pods Ready on 4 CSR-joined nodes (2 per mode) %s after the Deployments (attacks filed in %s)",
		time.Since(start).Round(100*time.Millisecond), attacked.Sub(start).Round(100*time.Millisecond))

	// Every node joined through a request the provider approved, recorded
	// on its NodeClaim, and got its serving certificate the same way.
	var registered []karpv1.NodeClaim
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		registered = nil
		for _, p := range []string{"csr-md", "csr-m"} {
			ncs := &karpv1.NodeClaimList{}
			if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: p}); err != nil {
				return false, err
			}
			n := 0
			for _, nc := range ncs.Items {
				if nc.DeletionTimestamp.IsZero() && nc.Status.NodeName != "" {
					registered, n = append(registered, nc), n+1
				}
			}
			if n != 2 || len(ncs.Items) != 2 {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("want 2 registered NodeClaims per pool and no other, have %v: %v", names(registered), err)
	}
	// The kubelets whose client certificate an attacker asked for first
	// joined with their own request, on the NodeClaim launched for them.
	for claim, v := range victims {
		if !v.clientAttacked {
			continue
		}
		nc := &karpv1.NodeClaim{}
		if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: claim}, nc); err != nil || nc.Status.NodeName != v.host {
			t.Fatalf("NodeClaim %s, whose node's client certificate was asked for by attackers first, did not register its kubelet's Node %s (Node %q, %v)", claim, v.host, nc.Status.NodeName, err)
		}
		if got, want := nc.Annotations[v1alpha1.KubeletClientCSRAnnotation], world.ClientCSRName(world.Instance{ID: instanceID(v.providerID)}); got != want {
			t.Fatalf("NodeClaim %s records client request %q, want its kubelet's %s", claim, got, want)
		}
	}
	for _, nc := range registered {
		cc := csrOf(t, nc.Status.NodeName, "client")
		if cc == nil || !approvedByProvider(cc) || len(cc.Status.Certificate) == 0 {
			t.Fatalf("client request of node %s: not approved by the provider and signed: %+v", nc.Status.NodeName, cc)
		}
		if got := nc.Annotations[v1alpha1.KubeletClientCSRAnnotation]; got != cc.Name {
			t.Fatalf("NodeClaim %s records client request %q, want %s", nc.Name, got, cc.Name)
		}
		if err := WaitFor(ctx, 30*time.Second, func(context.Context) (bool, error) {
			s := csrOf(t, nc.Status.NodeName, "serving")
			return s != nil && approvedByProvider(s) && len(s.Status.Certificate) > 0, nil
		}); err != nil {
			t.Fatalf("serving request of node %s not approved and signed: %v", nc.Status.NodeName, err)
		}
	}
	for _, kind := range []string{csrapproval.KindClient, csrapproval.KindServing} {
		series := fmt.Sprintf(`karpenter_clusterapi_kubelet_csr_decisions_total{decision="approved",kind=%q,reason="Approved"}`, kind)
		if v, ok, err := cur.Metric(series); err != nil || !ok || v < 4 {
			t.Fatalf("%s = %v (present %v, %v), want >= 4", series, v, ok, err)
		}
	}

	// Forged requests, made as a kubelet or bootstrapper could make them:
	// a bootstrap token asking for a name no Machine has; a second client
	// certificate for a node that registered; a node asking for a serving
	// certificate for a name that is not its Machine's.
	var victim karpv1.NodeClaim
	for _, nc := range registered {
		if victims[nc.Name].clientAttacked {
			victim = nc
		}
	}
	forged := append([]*certificatesv1.CertificateSigningRequest{}, attacks...)
	forged = append(forged, []*certificatesv1.CertificateSigningRequest{
		makeCSR(t, world.BootstrapTokenUser, []string{csrapproval.BootstrappersGroup}, "forged-unknown-node", certificatesv1.KubeAPIServerClientKubeletSignerName,
			x509.CertificateRequest{Subject: nodeName("ip-10-255-0-1.ec2.internal")}),
		// even with the node's own token
		makeCSR(t, victims[victim.Name].tokenUser, []string{csrapproval.BootstrappersGroup}, "forged-second-client", certificatesv1.KubeAPIServerClientKubeletSignerName,
			x509.CertificateRequest{Subject: nodeName(victim.Status.NodeName)}),
		makeCSR(t, csrapproval.NodeUserPrefix+victim.Status.NodeName, []string{csrapproval.NodesGroup}, "forged-serving-san", certificatesv1.KubeletServingSignerName,
			x509.CertificateRequest{Subject: nodeName(victim.Status.NodeName), DNSNames: []string{victim.Status.NodeName, "kubernetes.default.svc"}, IPAddresses: []net.IP{net.ParseIP("10.0.0.1")}}),
	}...)
	t.Cleanup(func() {
		for _, c := range forged[len(attacks):] {
			_ = w.Spoke.Client.Delete(context.Background(), c)
		}
	})
	for _, want := range []string{csrapproval.ReasonAlreadyRegistered, csrapproval.ReasonAddressNotOnMachine} {
		if err := WaitFor(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
			return hasEvent(ctx, victim.Name, "KubeletCSRNotApproved", want)
		}); err != nil {
			t.Fatalf("no KubeletCSRNotApproved event (%s) on NodeClaim %s: %v", want, victim.Name, err)
		}
	}

	// Without the flag: one more pod per pool launches one more node each,
	// whose kubelet asks and waits.
	cur.Stop()
	if cur, err = StartProvider(bin, w, "csr-off.log"); err != nil {
		t.Fatal(err)
	}
	// (The kubelets of the NodeClaims the foreign Nodes took asked too, and
	// wait in vain: only requests from here on count.)
	scaled := time.Now().Add(-time.Second)
	scaleDeployment(t, dMD, 3)
	scaleDeployment(t, dM, 3)
	var waiting []karpv1.NodeClaim
	var pendingCSRs []string
	if err := WaitFor(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		waiting, pendingCSRs = nil, nil
		for _, p := range []string{"csr-md", "csr-m"} {
			ncs := &karpv1.NodeClaimList{}
			if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: p}); err != nil {
				return false, err
			}
			for _, nc := range ncs.Items {
				if nc.Status.NodeName == "" && nc.Status.ProviderID != "" {
					waiting = append(waiting, nc)
				}
			}
		}
		list := &certificatesv1.CertificateSigningRequestList{}
		if err := w.Spoke.Client.List(ctx, list, client.MatchingLabels{world.CSRKindLabel: "client"}); err != nil {
			return false, err
		}
		for _, c := range list.Items {
			if len(c.Status.Conditions) == 0 && c.CreationTimestamp.After(scaled) {
				pendingCSRs = append(pendingCSRs, c.Name)
			}
		}
		return len(waiting) == 2 && len(pendingCSRs) == 2, nil
	}); err != nil {
		t.Fatalf("without the flag: want 2 launched NodeClaims waiting and 2 pending client requests, have %d and %v: %v", len(waiting), pendingCSRs, err)
	}
	for _, app := range []string{"app-csr-md", "app-csr-m"} {
		if n, err := readyPods(ctx, app); err != nil || n != 2 {
			t.Fatalf("without the flag, %s has %d Ready pods (%v), want 2: nothing approved the new kubelets", app, n, err)
		}
	}
	t.Logf("without the flag: NodeClaims %s launched, their kubelets' requests %v pending", names(waiting), pendingCSRs)

	// Karpenter's registration timeout (15 minutes from the Registered
	// condition's last transition) replaces them. The test moves that
	// transition 15 minutes back rather than waiting: core's own liveness
	// controller then decides, as it would a quarter of an hour later.
	for i := range waiting {
		nc := &waiting[i]
		patch := client.MergeFrom(nc.DeepCopy())
		for j := range nc.Status.Conditions {
			if nc.Status.Conditions[j].Type == karpv1.ConditionTypeRegistered {
				nc.Status.Conditions[j].LastTransitionTime = metav1.NewTime(time.Now().Add(-16 * time.Minute))
			}
		}
		if err := w.Spoke.Client.Status().Patch(ctx, nc, patch); err != nil {
			t.Fatal(err)
		}
	}
	if err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		for _, p := range []string{"csr-md", "csr-m"} {
			ncs := &karpv1.NodeClaimList{}
			if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: p}); err != nil {
				return false, err
			}
			replaced := false
			for _, nc := range ncs.Items {
				for _, old := range waiting {
					if nc.Name == old.Name {
						return false, nil
					}
				}
				replaced = replaced || nc.Status.NodeName == ""
			}
			if !replaced {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("the unregistered NodeClaims %s were not replaced after their registration timeout: %v", names(waiting), err)
	}

	// Nothing forged was ever approved, and nothing else either.
	for _, c := range forged {
		got := &certificatesv1.CertificateSigningRequest{}
		if err := w.Spoke.Client.Get(ctx, client.ObjectKeyFromObject(c), got); err != nil {
			t.Fatal(err)
		}
		if len(got.Status.Conditions) > 0 {
			t.Fatalf("forged request %s was decided: %+v", c.Name, got.Status.Conditions)
		}
	}
	for _, name := range pendingCSRs {
		got := &certificatesv1.CertificateSigningRequest{}
		if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: name}, got); err != nil {
			t.Fatal(err)
		}
		if len(got.Status.Conditions) > 0 {
			t.Fatalf("request %s was decided without the approver: %+v", name, got.Status.Conditions)
		}
	}
}

// victim is a launched NodeClaim whose kubelet has not asked yet: its
// Machine's node name, private IP, providerID and bootstrap token user.
type victim struct {
	pool, host, ip, providerID, tokenUser string
	// clientAttacked: attackers asked for its client certificate first.
	clientAttacked bool
}

// instanceID is the instance ID at the end of an AWS providerID.
func instanceID(providerID string) string {
	return providerID[strings.LastIndex(providerID, "/")+1:]
}

// launchedUnjoined waits for n NodeClaims of the pools that launched and
// whose Machines report their names, and returns them by NodeClaim name.
func launchedUnjoined(t *testing.T, pools []string, n int) map[string]victim {
	t.Helper()
	ctx := context.Background()
	var out map[string]victim
	if err := WaitFor(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		out = map[string]victim{}
		machines := &clusterv1.MachineList{}
		if err := w.Hub.Client.List(ctx, machines, client.InNamespace(w.Namespace)); err != nil {
			return false, err
		}
		byClaim := map[string]*clusterv1.Machine{}
		for i := range machines.Items {
			if claim := machines.Items[i].Annotations[v1alpha1.NodeClaimAnnotation]; claim != "" && machines.Items[i].DeletionTimestamp.IsZero() {
				byClaim[claim] = &machines.Items[i]
			}
		}
		for _, p := range pools {
			ncs := &karpv1.NodeClaimList{}
			if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: p}); err != nil {
				return false, err
			}
			for _, nc := range ncs.Items {
				m := byClaim[nc.Name]
				if nc.Status.ProviderID == "" || m == nil || !m.Spec.Bootstrap.ConfigRef.IsDefined() {
					continue
				}
				v := victim{pool: p, providerID: nc.Status.ProviderID}
				for _, a := range m.Status.Addresses {
					switch a.Type {
					case clusterv1.MachineInternalDNS:
						v.host = a.Address
					case clusterv1.MachineInternalIP:
						v.ip = a.Address
					}
				}
				cfg := &bootstrapv1.KubeadmConfig{}
				if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.Bootstrap.ConfigRef.Name}, cfg); err != nil {
					return false, client.IgnoreNotFound(err)
				}
				if id := csrapproval.TokenID(cfg.Spec.JoinConfiguration.Discovery.BootstrapToken.Token); id != "" && v.host != "" && v.ip != "" {
					v.tokenUser = csrapproval.BootstrapTokenUserPrefix + id
					out[nc.Name] = v
				}
			}
		}
		return len(out) == n, nil
	}); err != nil {
		t.Fatalf("want %d launched NodeClaims of %v whose Machines report a name and carry a bootstrap token, have %d: %v", n, pools, len(out), err)
	}
	return out
}

// attackPendingNodes files, for one victim of each pool, what an attacker
// would before the kubelet asks: a client request with a bootstrap token of
// its own, one as a tenant's node-bootstrapper service account, and, as
// another node claiming the victim's providerID on a Node of its own, a
// serving request with the victim's names. Each must be refused with the
// check named on the victim's NodeClaim; the foreign Node is then removed
// (the victim's kubelet could not register beside it).
func attackPendingNodes(t *testing.T, victims map[string]victim) []*certificatesv1.CertificateSigningRequest {
	t.Helper()
	ctx := context.Background()
	var out []*certificatesv1.CertificateSigningRequest
	// Per pool, the first victim's client certificate is asked for, the
	// second's serving certificate: a Node claiming another's providerID is
	// taken for that NodeClaim's by Karpenter core, which then replaces it
	// when the Node goes; the first must join as if nothing happened.
	seen := map[string]int{}
	var clientVictims, servingVictims []string
	for _, claim := range keys(victims) {
		v := victims[claim]
		switch seen[v.pool] {
		case 0:
			v.clientAttacked = true
			victims[claim] = v
			clientVictims = append(clientVictims, claim)
		case 1:
			servingVictims = append(servingVictims, claim)
		}
		seen[v.pool]++
	}
	for _, claim := range clientVictims {
		v := victims[claim]
		tenant := "system:serviceaccount:tenant-" + v.pool + ":node-bootstrapper"
		// A tenant allowed to file certificate requests, as any cluster
		// may let its workloads.
		mayRequest := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "csr-tenant-" + v.pool},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node-bootstrapper"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:serviceaccounts:tenant-" + v.pool}},
		}
		if err := w.Spoke.Client.Create(ctx, mayRequest); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Spoke.Client.Delete(context.Background(), mayRequest) })
		out = append(out,
			makeCSR(t, "system:bootstrap:att4ck", []string{csrapproval.BootstrappersGroup, world.KubeadmTokenGroup}, "attack-token-"+v.pool,
				certificatesv1.KubeAPIServerClientKubeletSignerName, x509.CertificateRequest{Subject: nodeName(v.host)}),
			makeCSR(t, tenant, []string{csrapproval.ServiceAccountsGroup, "system:serviceaccounts:tenant-" + v.pool}, "attack-sa-"+v.pool,
				certificatesv1.KubeAPIServerClientKubeletSignerName, x509.CertificateRequest{Subject: nodeName(v.host)}),
		)
		for _, want := range []string{csrapproval.ReasonNotTheMachinesToken, csrapproval.ReasonIdentity} {
			if err := WaitFor(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
				return hasEvent(ctx, claim, "KubeletCSRNotApproved", want)
			}); err != nil {
				logCSRs(t)
				t.Fatalf("%s: no KubeletCSRNotApproved event (%s) on NodeClaim %s: %v", v.pool, want, claim, err)
			}
		}
	}
	for _, claim := range servingVictims {
		v := victims[claim]
		evil := "evil-" + v.pool
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: evil}, Spec: corev1.NodeSpec{ProviderID: v.providerID}}
		if err := w.Spoke.Client.Create(ctx, node); err != nil {
			t.Fatal(err)
		}
		out = append(out, makeCSR(t, csrapproval.NodeUserPrefix+evil, []string{csrapproval.NodesGroup}, "attack-serving-"+v.pool,
			certificatesv1.KubeletServingSignerName, x509.CertificateRequest{Subject: nodeName(evil), DNSNames: []string{v.host}, IPAddresses: []net.IP{net.ParseIP(v.ip)}}))
		for _, want := range []string{csrapproval.ReasonNameNotOnMachine} {
			if err := WaitFor(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
				return hasEvent(ctx, claim, "KubeletCSRNotApproved", want)
			}); err != nil {
				logCSRs(t)
				t.Fatalf("%s: no KubeletCSRNotApproved event (%s) on NodeClaim %s: %v", v.pool, want, claim, err)
			}
		}
		if err := w.Spoke.Client.Delete(ctx, node); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// csrOf returns the simulated kubelet's request of a kind for a node, or nil.
func csrOf(t testing.TB, node, kind string) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	list := &certificatesv1.CertificateSigningRequestList{}
	if err := w.Spoke.Client.List(context.Background(), list, client.MatchingLabels{world.CSRNodeLabel: node, world.CSRKindLabel: kind}); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) == 0 {
		return nil
	}
	return &list.Items[0]
}

func approvedByProvider(c *certificatesv1.CertificateSigningRequest) bool {
	for _, cond := range c.Status.Conditions {
		if cond.Type == certificatesv1.CertificateApproved && cond.Status == corev1.ConditionTrue && cond.Reason == "KarpenterClusterAPIApprove" {
			return true
		}
	}
	return false
}

func nodeName(name string) pkix.Name {
	return pkix.Name{CommonName: csrapproval.NodeUserPrefix + name, Organization: []string{csrapproval.NodesGroup}}
}

// makeCSR creates a well-formed request (ECDSA P-256, the kubelet
// signers' usages) as user.
func makeCSR(t testing.TB, user string, groups []string, name, signer string, tmpl x509.CertificateRequest) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	usage := certificatesv1.UsageClientAuth
	if signer == certificatesv1.KubeletServingSignerName {
		usage = certificatesv1.UsageServerAuth
	}
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			SignerName: signer, Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, usage},
			Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
		},
	}
	cfg := rest.CopyConfig(w.Spoke.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:authenticated")}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CertificatesV1().CertificateSigningRequests().Create(context.Background(), csr, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating request %s as %s: %v", name, user, err)
	}
	return csr
}

// hasEvent reports whether the NodeClaim has an event of that reason whose
// message names the check.
func hasEvent(ctx context.Context, claim, reason, check string) (bool, error) {
	events := &corev1.EventList{}
	if err := w.Spoke.Client.List(ctx, events); err != nil {
		return false, err
	}
	for _, e := range events.Items {
		if e.InvolvedObject.Kind == "NodeClaim" && e.InvolvedObject.Name == claim && e.Reason == reason && strings.Contains(e.Message, "("+check+")") {
			return true, nil
		}
	}
	return false, nil
}

func names(ncs []karpv1.NodeClaim) []string {
	out := make([]string, 0, len(ncs))
	for _, nc := range ncs {
		out = append(out, nc.Name)
	}
	return out
}

// logCSRs logs every request with its conditions, for a failure.
func logCSRs(t testing.TB) {
	list := &certificatesv1.CertificateSigningRequestList{}
	if err := w.Spoke.Client.List(context.Background(), list); err != nil {
		return
	}
	for _, c := range list.Items {
		t.Logf("CSR %s signer=%s user=%s conditions=%+v certificate=%d bytes", c.Name, c.Spec.SignerName, c.Spec.Username, c.Status.Conditions, len(c.Status.Certificate))
	}
}
