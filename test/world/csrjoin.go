package world

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// JoinMode is how the simulated kubelets join their workload cluster.
type JoinMode int32

const (
	// JoinDirect (the default): a kubelet registers its Node as soon as its
	// instance runs, as with kubeadm's bootstrap tokens whose client
	// certificates kube-controller-manager approves.
	JoinDirect JoinMode = iota
	// JoinWithCSR: a kubelet joins as in clusters whose bootstrapper's
	// requests nothing approves by default: it asks for its client
	// certificate (signer kubernetes.io/kube-apiserver-client-kubelet) as
	// the bootstrap token user BootstrapTokenUser, registers its Node only
	// once the request is approved and kube-controller-manager issued the
	// certificate, then asks for its serving certificate
	// (kubernetes.io/kubelet-serving, serverTLSBootstrap) as
	// system:node:<name>, for its hostname and private IP.
	JoinWithCSR
)

const (
	// BootstrapTokenUser is the user a JoinWithCSR kubelet's client request
	// is made as when its bootstrap data carries no token of its own (a
	// shared data Secret): one bootstrap token every such kubelet shares.
	// A KubeadmConfig's kubelet asks as its Machine's own token
	// (BootstrapTokenUserOf).
	BootstrapTokenUser = "system:bootstrap:w0rld1"
	// KubeadmTokenGroup is the extra group of CABPK's tokens.
	KubeadmTokenGroup = "system:bootstrappers:kubeadm:default-node-token"
	// CSRNodeLabel on a simulated kubelet's CertificateSigningRequests names
	// its Node.
	CSRNodeLabel = "world.test/node"
	// CSRKindLabel says "client" or "serving".
	CSRKindLabel = "world.test/csr-kind"
)

// SetKubeletJoin sets how the kubelets of every Cluster of the world join
// from now on (a kubelet that registered stays registered).
func (w *World) SetKubeletJoin(m JoinMode) { w.kubeletJoin.Store(int32(m)) }

func (w *World) joinMode() JoinMode { return JoinMode(w.kubeletJoin.Load()) }

// HoldKubeletJoin(true) makes JoinWithCSR kubelets that have not asked for
// their client certificate yet wait before asking, as a slow boot would (a
// test then files requests ahead of them); HoldKubeletJoin(false) lets them
// ask.
func (w *World) HoldKubeletJoin(hold bool) { w.kubeletHold.Store(hold) }

func (w *World) kubeletHeld() bool { return w.kubeletHold.Load() }

// ClientCSRName and ServingCSRName are the names of the requests of the
// kubelet of an instance.
func ClientCSRName(in Instance) string  { return "kubelet-client-" + in.ID }
func ServingCSRName(in Instance) string { return "kubelet-serving-" + in.ID }

// joinWithCSR runs a JoinWithCSR kubelet's bootstrap: it returns true once
// its client certificate is issued (the Node may register), else how long
// to wait before looking again (a CSR event also brings it back).
func (k *simKubelet) joinWithCSR(ctx context.Context, in Instance, boot BootstrapData) (bool, error) {
	if err := k.ensureBootstrapRBAC(ctx); err != nil {
		return false, err
	}
	csr := &certificatesv1.CertificateSigningRequest{}
	err := k.client.Get(ctx, client.ObjectKey{Name: ClientCSRName(in)}, csr)
	if apierrors.IsNotFound(err) {
		if k.holdJoin != nil && k.holdJoin() {
			return false, nil // World.HoldKubeletJoin: the kubelet looks again shortly
		}
		req, err := k.request(in, "client", &x509.CertificateRequest{Subject: nodeSubject(in.Hostname)})
		if err != nil {
			return false, err
		}
		csr = kubeletCSR(ClientCSRName(in), in.Hostname, "client", certificatesv1.KubeAPIServerClientKubeletSignerName, req,
			certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth)
		groups := []string{"system:bootstrappers", "system:authenticated"}
		if boot.BootstrapToken != "" {
			groups = append(groups, KubeadmTokenGroup)
		}
		return false, k.createAs(ctx, rest.ImpersonationConfig{UserName: BootstrapTokenUserOf(boot), Groups: groups}, csr)
	}
	if err != nil {
		return false, err
	}
	return len(csr.Status.Certificate) > 0, nil
}

// requestServingCert asks for the serving certificate of a registered
// kubelet, once.
func (k *simKubelet) requestServingCert(ctx context.Context, in Instance) error {
	csr := &certificatesv1.CertificateSigningRequest{}
	err := k.client.Get(ctx, client.ObjectKey{Name: ServingCSRName(in)}, csr)
	if !apierrors.IsNotFound(err) {
		return err
	}
	req, err := k.request(in, "serving", &x509.CertificateRequest{
		Subject: nodeSubject(in.Hostname), DNSNames: []string{in.Hostname}, IPAddresses: []net.IP{net.ParseIP(in.PrivateIP)},
	})
	if err != nil {
		return err
	}
	csr = kubeletCSR(ServingCSRName(in), in.Hostname, "serving", certificatesv1.KubeletServingSignerName, req,
		certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth)
	return k.createAs(ctx, rest.ImpersonationConfig{UserName: "system:node:" + in.Hostname, Groups: []string{"system:nodes", "system:authenticated"}}, csr)
}

func nodeSubject(host string) pkix.Name {
	return pkix.Name{CommonName: "system:node:" + host, Organization: []string{"system:nodes"}}
}

func kubeletCSR(name, host, kind, signer string, req []byte, usages ...certificatesv1.KeyUsage) *certificatesv1.CertificateSigningRequest {
	return &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{CSRNodeLabel: host, CSRKindLabel: kind}},
		Spec:       certificatesv1.CertificateSigningRequestSpec{SignerName: signer, Request: req, Usages: usages},
	}
}

// request makes a PKCS#10 request with a new ECDSA P-256 key, as the
// kubelet does.
func (k *simKubelet) request(in Instance, kind string, tmpl *x509.CertificateRequest) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return nil, fmt.Errorf("kubelet of %s: %s certificate request: %w", in.ID, kind, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// createAs creates a request as the given user: the API server records
// that user as the requester (spec.username, spec.groups).
func (k *simKubelet) createAs(ctx context.Context, as rest.ImpersonationConfig, csr *certificatesv1.CertificateSigningRequest) error {
	cfg := rest.CopyConfig(k.config)
	cfg.Impersonate = as
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	_, err = cs.CertificatesV1().CertificateSigningRequests().Create(ctx, csr, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// ensureBootstrapRBAC lets bootstrap tokens and nodes create certificate
// requests, as a cluster's bootstrapper does (system:node-bootstrapper).
func (k *simKubelet) ensureBootstrapRBAC(ctx context.Context) error {
	if k.rbacDone.Load() {
		return nil
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "world-kubelet-bootstrap"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node-bootstrapper"},
		Subjects: []rbacv1.Subject{
			{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:bootstrappers"},
			{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:nodes"},
		},
	}
	if err := client.IgnoreAlreadyExists(k.client.Create(ctx, binding)); err != nil {
		return fmt.Errorf("binding system:node-bootstrapper: %w", err)
	}
	k.rbacDone.Store(true)
	return nil
}

// csrToNode wakes the kubelet of the Node a request is for.
func csrToNode(_ context.Context, o client.Object) []reconcile.Request {
	if host := o.GetLabels()[CSRNodeLabel]; host != "" {
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: host}}}
	}
	return nil
}

// writeSignerCA writes a CA that the spoke's kube-controller-manager signs
// the kubelets' certificates with (its csrsigning controller).
func writeSignerCA(dir, suffix string) (certPath, keyPath string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "world-kubelet-signer" + suffix},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certPath = filepath.Join(dir, "kubelet-signer"+suffix+".crt")
	keyPath = filepath.Join(dir, "kubelet-signer"+suffix+".key")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", "", err
	}
	return certPath, keyPath, nil
}
