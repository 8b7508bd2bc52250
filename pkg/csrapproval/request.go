package csrapproval

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
)

// Names the Kubernetes kubelet signers and identities use.
const (
	// NodeUserPrefix starts the user name of a node (and the CN it asks for).
	NodeUserPrefix = "system:node:"
	// NodesGroup is the group (and the certificate's only organization) of nodes.
	NodesGroup = "system:nodes"
	// BootstrappersGroup holds the bootstrap-token users (system:bootstrap:<id>).
	BootstrappersGroup = "system:bootstrappers"
	// BootstrapTokenUserPrefix starts the user name of a bootstrap token.
	BootstrapTokenUserPrefix = "system:bootstrap:"
	// ServiceAccountUserPrefix starts the user name of a service account
	// (system:serviceaccount:<namespace>:<name>).
	ServiceAccountUserPrefix = "system:serviceaccount:"
	// ServiceAccountsGroup holds every service account.
	ServiceAccountsGroup = "system:serviceaccounts"
)

// tokenUser is a bootstrap token's user name: the token ID is six
// lower-case letters or digits (k8s.io/cluster-bootstrap's token format).
var tokenUser = regexp.MustCompile(`^system:bootstrap:[a-z0-9]{6}$`)

// usage sets the kubelet signers accept (k8s.io/kubernetes
// pkg/apis/certificates: ValidateKubeletClientCSR, ValidateKubeletServingCSR):
// with key encipherment (RSA keys) or without.
var (
	clientUsages = [][]certificatesv1.KeyUsage{
		{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageClientAuth},
		{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
	}
	servingUsages = [][]certificatesv1.KeyUsage{
		{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth},
		{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth},
	}
)

// Request is what the approver reads of a CertificateSigningRequest: who
// asked, for which signer, and the parsed PKCS#10 request.
type Request struct {
	// Name of the CertificateSigningRequest.
	Name       string
	SignerName string
	// Username, UID, Groups and Extra are the requester's, as the API
	// server recorded them.
	Username string
	UID      string
	Groups   []string
	Extra    map[string]certificatesv1.ExtraValue
	Usages   []certificatesv1.KeyUsage
	// Created is when the API server received the request.
	Created time.Time
	// X509 is the parsed request; nil when spec.request is not one (ParseErr says why).
	X509     *x509.CertificateRequest
	ParseErr error
	// NodeName is the CN without "system:node:"; empty when the CN has no such prefix.
	NodeName string
}

// canonicalNodeName is the request's node name in canonical form: what the
// controller looks Machines up by.
func (r *Request) canonicalNodeName() string { return canonicalName(r.NodeName) }

// ReadRequest reads a CertificateSigningRequest. It never fails: a request
// that does not parse is recorded in ParseErr, for Judge to refuse.
func ReadRequest(csr *certificatesv1.CertificateSigningRequest) Request {
	r := Request{
		Name:       csr.Name,
		SignerName: csr.Spec.SignerName,
		Username:   csr.Spec.Username,
		UID:        csr.Spec.UID,
		Groups:     csr.Spec.Groups,
		Extra:      csr.Spec.Extra,
		Usages:     csr.Spec.Usages,
		Created:    csr.CreationTimestamp.Time,
	}
	r.X509, r.ParseErr = parsePEM(csr.Spec.Request)
	if r.X509 != nil {
		if name, ok := strings.CutPrefix(r.X509.Subject.CommonName, NodeUserPrefix); ok {
			r.NodeName = name
		}
	}
	return r
}

// parsePEM parses spec.request: exactly one PEM block "CERTIFICATE
// REQUEST" holding a PKCS#10 request.
func parsePEM(data []byte) (*x509.CertificateRequest, error) {
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, errors.New("spec.request holds no PEM block")
	}
	if block.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("spec.request holds a PEM block %q, not \"CERTIFICATE REQUEST\"", block.Type)
	}
	if more, _ := pem.Decode(rest); more != nil {
		return nil, errors.New("spec.request holds more than one PEM block")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("spec.request is not a PKCS#10 certificate request: %w", err)
	}
	return req, nil
}

// bootstrapTokenUser reports whether the requester is a bootstrap token:
// system:bootstrap:<token id> in group system:bootstrappers.
func (r *Request) bootstrapTokenUser() bool {
	return tokenUser.MatchString(r.Username) && slices.Contains(r.Groups, BootstrappersGroup)
}

// serviceAccount reports whether the requester is the service account
// "<namespace>/<name>".
func (r *Request) serviceAccount(namespacedName string) bool {
	ns, name, ok := strings.Cut(namespacedName, "/")
	return ok && ns != "" && name != "" && r.Username == ServiceAccountUserPrefix+ns+":"+name && slices.Contains(r.Groups, ServiceAccountsGroup)
}

// nodeIdentity reports whether the requester is the node NodeName itself.
func (r *Request) nodeIdentity() bool {
	return r.NodeName != "" && r.Username == NodeUserPrefix+r.NodeName && slices.Contains(r.Groups, NodesGroup)
}

// checkSubject checks the subject as the kubelet signers do: organization
// exactly system:nodes, and for a client certificate no SAN at all, for a
// serving one a DNS or IP SAN and no e-mail or URI.
func (r *Request) checkSubject(serving bool) error {
	x := r.X509
	if !slices.Equal(x.Subject.Organization, []string{NodesGroup}) {
		return fmt.Errorf("subject organization is %q, must be exactly [%s]", x.Subject.Organization, NodesGroup)
	}
	if len(x.EmailAddresses) > 0 || len(x.URIs) > 0 {
		return errors.New("e-mail and URI subject alternative names are not allowed")
	}
	if serving {
		if len(x.DNSNames) == 0 && len(x.IPAddresses) == 0 {
			return errors.New("a serving certificate needs a DNS name or an IP address")
		}
		return nil
	}
	if len(x.DNSNames) > 0 || len(x.IPAddresses) > 0 {
		return errors.New("a client certificate takes no DNS name or IP address")
	}
	return nil
}

// checkUsages checks spec.usages against the sets the signer accepts.
func (r *Request) checkUsages(serving bool) error {
	want := clientUsages
	if serving {
		want = servingUsages
	}
	got := slices.Clone(r.Usages)
	slices.Sort(got)
	for _, w := range want {
		w = slices.Clone(w)
		slices.Sort(w)
		if slices.Equal(got, w) {
			return nil
		}
	}
	return fmt.Errorf("usages %v are not %v (or without %q)", r.Usages, want[0], certificatesv1.UsageKeyEncipherment)
}

// checkKey accepts the keys a kubelet makes or may be given: ECDSA on
// P-256, P-384 or P-521, Ed25519, and RSA of 2048 bits or more.
func (r *Request) checkKey() error {
	switch k := r.X509.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() && k.Curve != elliptic.P521() {
			return fmt.Errorf("ECDSA curve %s is not P-256, P-384 or P-521", k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return fmt.Errorf("RSA key of %d bits is shorter than 2048", k.N.BitLen())
		}
	default:
		return fmt.Errorf("key type %s is not ECDSA, Ed25519 or RSA", r.X509.PublicKeyAlgorithm)
	}
	return nil
}

// sans returns the request's DNS names and IP addresses in canonical form.
func (r *Request) sans() []string {
	out := make([]string, 0, len(r.X509.DNSNames)+len(r.X509.IPAddresses))
	for _, n := range r.X509.DNSNames {
		out = append(out, canonicalName(n))
	}
	for _, ip := range r.X509.IPAddresses {
		out = append(out, ip.String())
	}
	return out
}

// canonicalAddress writes an address as sans does: IPs canonical, names in
// canonicalName's form.
func canonicalAddress(a string) string {
	if ip := net.ParseIP(a); ip != nil {
		return ip.String()
	}
	return canonicalName(a)
}

// canonicalName writes a DNS name as it compares: lower case, without a
// trailing dot (DNS names are case-insensitive, and "a.b." is "a.b").
func canonicalName(n string) string {
	return strings.TrimSuffix(strings.ToLower(n), ".")
}

// CanonicalNodeName is canonicalName for the node name a request asks for:
// the key the controller indexes requests and Machines by.
func CanonicalNodeName(n string) string { return canonicalName(n) }
