package csrapproval

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"net/url"
	"slices"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

const (
	node      = "ip-10-0-1-7.ec2.internal"
	nodeIP    = "10.0.1.7"
	bootUser  = "system:bootstrap:abcdef"
	csrName   = "csr-1"
	claimName = "general-x7k2p"
)

var (
	// machineCreated is when the test's Machine was created; its kubelet's
	// requests come later (requested).
	machineCreated     = time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	requested          = machineCreated.Add(90 * time.Second)
	clientUsagesECDSA  = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	servingUsagesECDSA = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
	p256               = mustKey(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))
)

func mustKey[K any](k K, err error) K {
	if err != nil {
		panic(err)
	}
	return k
}

// pemRequest signs a PKCS#10 request for tmpl with key.
func pemRequest(t *testing.T, tmpl *x509.CertificateRequest, key crypto.Signer) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func subject(name string) pkix.Name {
	return pkix.Name{CommonName: NodeUserPrefix + name, Organization: []string{NodesGroup}}
}

// clientCSR is the request a joining kubelet makes: an ECDSA P-256 key,
// system:node:<node> in system:nodes, asked by a bootstrap token.
func clientCSR(t *testing.T, mutate func(*certificatesv1.CertificateSigningRequest, *x509.CertificateRequest) crypto.Signer) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: csrName, CreationTimestamp: metav1.NewTime(requested)},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
			Username:   bootUser,
			Groups:     []string{BootstrappersGroup, "system:authenticated"},
			Usages:     clientUsagesECDSA,
		},
	}
	tmpl := &x509.CertificateRequest{Subject: subject(node)}
	var key crypto.Signer = p256
	if mutate != nil {
		if k := mutate(csr, tmpl); k != nil {
			key = k
		}
	}
	csr.Spec.Request = pemRequest(t, tmpl, key)
	return csr
}

// servingCSR is the request a joined kubelet makes for its serving
// certificate: its hostname and IP.
func servingCSR(t *testing.T, mutate func(*certificatesv1.CertificateSigningRequest, *x509.CertificateRequest) crypto.Signer) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: csrName, CreationTimestamp: metav1.NewTime(requested)},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			SignerName: certificatesv1.KubeletServingSignerName,
			Username:   NodeUserPrefix + node,
			Groups:     []string{NodesGroup, "system:authenticated"},
			Usages:     servingUsagesECDSA,
		},
	}
	tmpl := &x509.CertificateRequest{Subject: subject(node), DNSNames: []string{node}, IPAddresses: []net.IP{net.ParseIP(nodeIP)}}
	var key crypto.Signer = p256
	if mutate != nil {
		if k := mutate(csr, tmpl); k != nil {
			key = k
		}
	}
	csr.Spec.Request = pemRequest(t, tmpl, key)
	return csr
}

func machine() Machine {
	return Machine{Key: "default/c1-general-x7k2p", Created: machineCreated, Addresses: clusterv1.MachineAddresses{
		{Type: clusterv1.MachineInternalIP, Address: nodeIP},
		{Type: clusterv1.MachineInternalDNS, Address: node},
	}}
}

func claim() *NodeClaim {
	return &NodeClaim{Name: claimName, Ours: true, Launched: true}
}

// clientFacts: one Machine of the provider reports the name; its NodeClaim
// launched and has not registered.
func clientFacts(mutate func(*Facts)) Facts {
	f := Facts{Machines: []Candidate{{Machine: machine(), NodeClaimName: claimName, NodeClaim: claim()}}}
	if mutate != nil {
		mutate(&f)
	}
	return f
}

// servingFacts: Node <node> is a registered NodeClaim's of the provider.
func servingFacts(mutate func(*Facts)) Facts {
	nc := claim()
	nc.Registered = true
	m := machine()
	f := Facts{NodeExists: true, NodeClaim: nc, Machine: &m}
	if mutate != nil {
		mutate(&f)
	}
	return f
}

func TestJudge(t *testing.T) {
	cases := []struct {
		name   string
		csr    *certificatesv1.CertificateSigningRequest
		facts  Facts
		want   Verdict
		reason string
	}{
		// Client requests.
		{name: "client: a joining kubelet of a launched NodeClaim", csr: clientCSR(t, nil), facts: clientFacts(nil), want: Approve, reason: ReasonApproved},
		{name: "client: RSA 2048 key with key encipherment", csr: clientCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
			c.Spec.Usages = append(c.Spec.Usages, certificatesv1.UsageKeyEncipherment)
			return mustKey(rsa.GenerateKey(rand.Reader, 2048))
		}), facts: clientFacts(nil), want: Approve, reason: ReasonApproved},
		{name: "client: Ed25519 key", csr: clientCSR(t, func(*certificatesv1.CertificateSigningRequest, *x509.CertificateRequest) crypto.Signer {
			_, k, _ := ed25519.GenerateKey(rand.Reader)
			return k
		}), facts: clientFacts(nil), want: Approve, reason: ReasonApproved},
		{name: "client: a node-bootstrapper service account nobody configured", csr: clientCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
			c.Spec.Username, c.Spec.Groups = "system:serviceaccount:openshift-machine-config-operator:node-bootstrapper", []string{"system:serviceaccounts"}
			return nil
		}), facts: clientFacts(nil), want: Refuse, reason: ReasonIdentity},
		{name: "client: the same request again after approval recorded", csr: clientCSR(t, nil), facts: clientFacts(func(f *Facts) {
			f.Machines[0].NodeClaim.ApprovedClientCSR = csrName
		}), want: Approve, reason: ReasonApproved},
		{name: "client: forged node name (no Machine of ours reports it)", csr: clientCSR(t, func(_ *certificatesv1.CertificateSigningRequest, x *x509.CertificateRequest) crypto.Signer {
			x.Subject = subject("ip-10-9-9-9.ec2.internal")
			return nil
		}), facts: Facts{}, want: NotOurs},
		{name: "client: a node of another Cluster (its Machine is not in scope)", csr: clientCSR(t, nil), facts: Facts{}, want: NotOurs},
		{name: "client: renewal by the node itself", csr: clientCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
			c.Spec.Username, c.Spec.Groups = NodeUserPrefix+node, []string{NodesGroup}
			return nil
		}), facts: clientFacts(func(f *Facts) { f.Machines[0].NodeClaim.Registered = true; f.NodeExists = true }), want: NotOurs},
		{name: "client: a second request for a NodeClaim that registered", csr: clientCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
			c.Name = "csr-2"
			return nil
		}), facts: clientFacts(func(f *Facts) {
			f.Machines[0].NodeClaim.Registered = true
			f.Machines[0].NodeClaim.ApprovedClientCSR = csrName
			f.NodeExists = true
		}), want: Refuse, reason: ReasonAlreadyRegistered},
		{name: "client: a second request before registration", csr: clientCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
			c.Name = "csr-2"
			return nil
		}), facts: clientFacts(func(f *Facts) { f.Machines[0].NodeClaim.ApprovedClientCSR = csrName }), want: Refuse, reason: ReasonAlreadyApproved},
		{name: "client: a Node of that name exists though the NodeClaim has not registered", csr: clientCSR(t, nil),
			facts: clientFacts(func(f *Facts) { f.NodeExists = true }), want: Refuse, reason: ReasonAlreadyRegistered},
		{name: "client: not a bootstrap identity", csr: clientCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
			c.Spec.Username, c.Spec.Groups = "alice", []string{"developers"}
			return nil
		}), facts: clientFacts(nil), want: Refuse, reason: ReasonIdentity},
		{name: "client: bootstrap user name without the bootstrappers group", csr: clientCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
			c.Spec.Groups = []string{"system:authenticated"}
			return nil
		}), facts: clientFacts(nil), want: Refuse, reason: ReasonIdentity},
		{name: "client: another node's identity", csr: clientCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
			c.Spec.Username, c.Spec.Groups = NodeUserPrefix+"ip-10-0-1-8.ec2.internal", []string{NodesGroup}
			return nil
		}), facts: clientFacts(nil), want: Refuse, reason: ReasonIdentity},
		{name: "client: the name on two Machines", csr: clientCSR(t, nil), facts: clientFacts(func(f *Facts) {
			other := Candidate{Machine: machine(), NodeClaim: claim()}
			other.Machine.Key = "default/c1-general-zzzzz"
			f.Machines = append(f.Machines, other)
		}), want: Refuse, reason: ReasonAmbiguousName},
		{name: "client: Machine being deleted", csr: clientCSR(t, nil), facts: clientFacts(func(f *Facts) { f.Machines[0].Machine.Deleting = true }), want: Refuse, reason: ReasonMachineDeleting},
		{name: "client: Machine not bound yet", csr: clientCSR(t, nil), facts: clientFacts(func(f *Facts) {
			f.Machines[0].NodeClaimName, f.Machines[0].NodeClaim = "", nil
		}), want: Refuse, reason: ReasonMachineNotBound},
		{name: "client: NodeClaim gone", csr: clientCSR(t, nil), facts: clientFacts(func(f *Facts) { f.Machines[0].NodeClaim = nil }), want: Refuse, reason: ReasonNodeClaimNotFound},
		{name: "client: NodeClaim of another NodeClass", csr: clientCSR(t, nil), facts: clientFacts(func(f *Facts) { f.Machines[0].NodeClaim.Ours = false }), want: Refuse, reason: ReasonNodeClaimNotOurs},
		{name: "client: NodeClaim being deleted", csr: clientCSR(t, nil), facts: clientFacts(func(f *Facts) { f.Machines[0].NodeClaim.Deleting = true }), want: Refuse, reason: ReasonNodeClaimDeleting},
		{name: "client: NodeClaim not launched", csr: clientCSR(t, nil), facts: clientFacts(func(f *Facts) { f.Machines[0].NodeClaim.Launched = false }), want: Refuse, reason: ReasonNotLaunched},
		{name: "client: organization other than system:nodes", csr: clientCSR(t, func(_ *certificatesv1.CertificateSigningRequest, x *x509.CertificateRequest) crypto.Signer {
			x.Subject.Organization = []string{NodesGroup, "system:masters"}
			return nil
		}), facts: clientFacts(nil), want: Refuse, reason: ReasonSubject},
		{name: "client: a DNS name in a client request", csr: clientCSR(t, func(_ *certificatesv1.CertificateSigningRequest, x *x509.CertificateRequest) crypto.Signer {
			x.DNSNames = []string{node}
			return nil
		}), facts: clientFacts(nil), want: Refuse, reason: ReasonSubject},
		{name: "client: server auth usage", csr: clientCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
			c.Spec.Usages = append(c.Spec.Usages, certificatesv1.UsageServerAuth)
			return nil
		}), facts: clientFacts(nil), want: Refuse, reason: ReasonUsages},
		{name: "client: no usages", csr: clientCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
			c.Spec.Usages = nil
			return nil
		}), facts: clientFacts(nil), want: Refuse, reason: ReasonUsages},
		{name: "client: RSA 1024 key", csr: clientCSR(t, func(*certificatesv1.CertificateSigningRequest, *x509.CertificateRequest) crypto.Signer {
			return mustKey(rsa.GenerateKey(rand.Reader, 1024))
		}), facts: clientFacts(nil), want: Refuse, reason: ReasonKeyType},
		{name: "client: ECDSA P-224 key", csr: clientCSR(t, func(*certificatesv1.CertificateSigningRequest, *x509.CertificateRequest) crypto.Signer {
			return mustKey(ecdsa.GenerateKey(elliptic.P224(), rand.Reader))
		}), facts: clientFacts(nil), want: Refuse, reason: ReasonKeyType},
		{name: "client: signature does not verify", csr: tamper(clientCSR(t, nil)), facts: clientFacts(nil), want: Refuse, reason: ReasonSignature},
		{name: "client: CN without system:node:", csr: clientCSR(t, func(_ *certificatesv1.CertificateSigningRequest, x *x509.CertificateRequest) crypto.Signer {
			x.Subject.CommonName = node
			return nil
		}), facts: clientFacts(nil), want: Refuse, reason: ReasonSubject},

		// Serving requests.
		{name: "serving: a joined kubelet's hostname and IP", csr: servingCSR(t, nil), facts: servingFacts(nil), want: Approve, reason: ReasonApproved},
		{name: "serving: IPv6 written differently on the Machine", csr: servingCSR(t, func(_ *certificatesv1.CertificateSigningRequest, x *x509.CertificateRequest) crypto.Signer {
			x.IPAddresses = []net.IP{net.ParseIP("fd00::7")}
			x.DNSNames = nil
			return nil
		}), facts: servingFacts(func(f *Facts) {
			f.Machine.Addresses = append(f.Machine.Addresses, clusterv1.MachineAddress{Type: clusterv1.MachineInternalIP, Address: "fd00:0:0:0::7"})
		}), want: Approve, reason: ReasonApproved},
		{name: "serving: a DNS name not on the Machine", csr: servingCSR(t, func(_ *certificatesv1.CertificateSigningRequest, x *x509.CertificateRequest) crypto.Signer {
			x.DNSNames = append(x.DNSNames, "kubernetes.default.svc")
			return nil
		}), facts: servingFacts(nil), want: Refuse, reason: ReasonAddressNotOnMachine},
		{name: "serving: an IP not on the Machine", csr: servingCSR(t, func(_ *certificatesv1.CertificateSigningRequest, x *x509.CertificateRequest) crypto.Signer {
			x.IPAddresses = append(x.IPAddresses, net.ParseIP("10.0.1.8"))
			return nil
		}), facts: servingFacts(nil), want: Refuse, reason: ReasonAddressNotOnMachine},
		{name: "serving: a Node that is not the provider's", csr: servingCSR(t, nil), facts: Facts{NodeExists: true}, want: NotOurs},
		{name: "serving: no such Node", csr: servingCSR(t, nil), facts: Facts{}, want: NotOurs},
		{name: "serving: asked by another node", csr: servingCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
			c.Spec.Username = NodeUserPrefix + "ip-10-0-1-8.ec2.internal"
			return nil
		}), facts: servingFacts(nil), want: Refuse, reason: ReasonIdentity},
		{name: "serving: asked by a bootstrap token", csr: servingCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
			c.Spec.Username, c.Spec.Groups = bootUser, []string{BootstrappersGroup}
			return nil
		}), facts: servingFacts(nil), want: Refuse, reason: ReasonIdentity},
		{name: "serving: node user without the nodes group", csr: servingCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
			c.Spec.Groups = []string{"system:authenticated"}
			return nil
		}), facts: servingFacts(nil), want: Refuse, reason: ReasonIdentity},
		{name: "serving: a second Node with the NodeClaim's providerID", csr: servingCSR(t, nil), facts: servingFacts(func(f *Facts) {
			f.NodeClaim.NodeName = "ip-10-0-1-8.ec2.internal"
		}), want: Refuse, reason: ReasonNotTheNodeClaimsNode},
		{name: "serving: the NodeClaim's own Node", csr: servingCSR(t, nil), facts: servingFacts(func(f *Facts) {
			f.NodeClaim.NodeName = node
		}), want: Approve, reason: ReasonApproved},
		{name: "serving: Machine not found", csr: servingCSR(t, nil), facts: servingFacts(func(f *Facts) { f.Machine = nil }), want: Refuse, reason: ReasonMachineNotFound},
		{name: "serving: no SAN", csr: servingCSR(t, func(_ *certificatesv1.CertificateSigningRequest, x *x509.CertificateRequest) crypto.Signer {
			x.DNSNames, x.IPAddresses = nil, nil
			return nil
		}), facts: servingFacts(nil), want: Refuse, reason: ReasonSubject},
		{name: "serving: a URI SAN", csr: servingCSR(t, func(_ *certificatesv1.CertificateSigningRequest, x *x509.CertificateRequest) crypto.Signer {
			x.URIs = []*url.URL{{Scheme: "spiffe", Host: "cluster.local", Path: "/ns/kube-system/sa/admin"}}
			return nil
		}), facts: servingFacts(nil), want: Refuse, reason: ReasonSubject},
		{name: "serving: client auth usage", csr: servingCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
			c.Spec.Usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
			return nil
		}), facts: servingFacts(nil), want: Refuse, reason: ReasonUsages},
		{name: "serving: signature does not verify", csr: tamper(servingCSR(t, nil)), facts: servingFacts(nil), want: Refuse, reason: ReasonSignature},

		// Malformed requests and other signers.
		{name: "malformed: not PEM", csr: withRequest(clientCSR(t, nil), []byte("hello")), facts: clientFacts(nil), want: Refuse, reason: ReasonMalformed},
		{name: "malformed: empty request", csr: withRequest(servingCSR(t, nil), nil), facts: servingFacts(nil), want: Refuse, reason: ReasonMalformed},
		{name: "malformed: a certificate, not a request", csr: withRequest(clientCSR(t, nil), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2, 3}})), facts: clientFacts(nil), want: Refuse, reason: ReasonMalformed},
		{name: "malformed: garbage DER", csr: withRequest(clientCSR(t, nil), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: []byte{0x30, 0x82, 0xff}})), facts: clientFacts(nil), want: Refuse, reason: ReasonMalformed},
		{name: "malformed: two PEM blocks", csr: withRequest(clientCSR(t, nil), append(clientCSR(t, nil).Spec.Request, clientCSR(t, nil).Spec.Request...)), facts: clientFacts(nil), want: Refuse, reason: ReasonMalformed},
		{name: "another signer", csr: func() *certificatesv1.CertificateSigningRequest {
			c := clientCSR(t, nil)
			c.Spec.SignerName = certificatesv1.KubeAPIServerClientSignerName
			return c
		}(), facts: clientFacts(nil), want: NotOurs},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Judge(Policy{}, ReadRequest(tc.csr), tc.facts)
			if got.Verdict != tc.want || got.Reason != tc.reason {
				t.Fatalf("Judge = %s/%s (%s), want %s/%s", got.Verdict, got.Reason, got.Message, tc.want, tc.reason)
			}
			if got.Verdict == Refuse && got.Message == "" {
				t.Fatal("a refusal must say which check failed")
			}
			r := ReadRequest(tc.csr)
			named := r.NodeName != "" && got.Reason != ReasonMalformed && got.Reason != ReasonAmbiguousName
			if got.Verdict != NotOurs && named && got.NodeClaim == "" && (tc.facts.NodeClaim != nil ||
				len(tc.facts.Machines) == 1 && tc.facts.Machines[0].NodeClaim != nil) {
				t.Fatalf("decision %s/%s names no NodeClaim: the event would have nowhere to go", got.Verdict, got.Reason)
			}
		})
	}
}

// tamper flips a bit of the request's signature.
func tamper(csr *certificatesv1.CertificateSigningRequest) *certificatesv1.CertificateSigningRequest {
	block, _ := pem.Decode(csr.Spec.Request)
	der := append([]byte(nil), block.Bytes...)
	der[len(der)-1] ^= 0x01
	csr.Spec.Request = pem.EncodeToMemory(&pem.Block{Type: block.Type, Bytes: der})
	return csr
}

func withRequest(csr *certificatesv1.CertificateSigningRequest, req []byte) *certificatesv1.CertificateSigningRequest {
	csr.Spec.Request = req
	return csr
}

// FuzzReadAndJudge: whatever the request holds and whatever the facts
// are, reading and judging never panics, and an approval always keeps the
// trust model: a parsed request, a client request not older than its
// Machine and asked by the Machine's token when it has one, no other
// eligible request competing; a serving request for one of the Machine's
// names carrying only its internal addresses.
func FuzzReadAndJudge(f *testing.F) {
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n"), "system:bootstrap:x", true, "", int64(0), "", uint8(0))
	f.Add([]byte{}, "", false, "abcdef", int64(-5), node, uint8(3))
	f.Add(validPEM(f, false), bootUser, false, "abcdef", int64(90), node, uint8(0))
	f.Add(validPEM(f, false), bootUser, false, "", int64(90), node, uint8(8))
	f.Add(validPEM(f, true), NodeUserPrefix+node, true, "", int64(90), "IP-10-0-1-7.ec2.internal.", uint8(5))
	f.Fuzz(func(t *testing.T, req []byte, user string, serving bool, tokenID string, age int64, address string, flags uint8) {
		csr := &certificatesv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{Name: csrName, CreationTimestamp: metav1.NewTime(machineCreated.Add(time.Duration(age) * time.Second))},
			Spec: certificatesv1.CertificateSigningRequestSpec{
				SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName, Request: req, Username: user,
				Groups: []string{BootstrappersGroup, NodesGroup}, Usages: clientUsagesECDSA,
			}}
		types := []clusterv1.MachineAddressType{clusterv1.MachineHostName, clusterv1.MachineInternalDNS, clusterv1.MachineExternalDNS, clusterv1.MachineInternalIP, clusterv1.MachineExternalIP}
		m := machine()
		m.BootstrapTokenID = tokenID
		if address != "" {
			m.Addresses = append(m.Addresses, clusterv1.MachineAddress{Type: types[int(flags)%len(types)], Address: address})
		}
		facts := clientFacts(func(f *Facts) {
			f.Machines[0].Machine = m
			f.Machines[0].NodeClaim.Registered = flags&0x10 != 0
			if flags&0x20 != 0 {
				f.Others = []Request{ReadRequest(clientCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
					c.Name, c.Spec.Username = "csr-other", user
					return nil
				}))}
			}
		})
		if serving {
			csr.Spec.SignerName, csr.Spec.Usages = certificatesv1.KubeletServingSignerName, servingUsagesECDSA
			facts = servingFacts(func(f *Facts) {
				f.Machine = &m
				f.NodeClaim.Registered = flags&0x10 != 0
				if flags&0x40 != 0 {
					f.NodeClaim.NodeName = address
				}
			})
		}
		policy := Policy{ServingExternalAddresses: flags&0x80 != 0}
		r := ReadRequest(csr)
		d := Judge(policy, r, facts)
		if d.Verdict != Approve {
			return
		}
		if r.X509 == nil {
			t.Fatalf("approved a request that does not parse: %v", r.ParseErr)
		}
		if !serving {
			if r.Created.Before(m.Created) {
				t.Fatalf("approved a client request older than its Machine: %s", d.Message)
			}
			if m.BootstrapTokenID != "" && r.Username != BootstrapTokenUserPrefix+m.BootstrapTokenID {
				t.Fatalf("approved %q for a Machine whose token is %s: %s", r.Username, m.BootstrapTokenID, d.Message)
			}
			if len(facts.Others) > 0 && facts.Others[0].X509 != nil {
				if reason, _ := clientEligible(policy, facts.Others[0], facts, m); reason == "" {
					t.Fatalf("approved with an eligible competitor pending: %s", d.Message)
				}
			}
			return
		}
		if !slices.Contains(machineNames(m), r.NodeName) {
			t.Fatalf("approved a serving certificate for %q, not a name of the Machine (%v)", r.NodeName, m.Addresses)
		}
		allowed, _ := servingAddresses(policy, m)
		for _, san := range r.sans() {
			if !allowed[san] {
				t.Fatalf("approved SAN %q, not an allowed address of the Machine", san)
			}
		}
	})
}

// validPEM is a well-formed kubelet request for the test's node: client, or
// serving with its name and IP.
func validPEM(f *testing.F, serving bool) []byte {
	tmpl := &x509.CertificateRequest{Subject: subject(node)}
	if serving {
		tmpl.DNSNames, tmpl.IPAddresses = []string{node}, []net.IP{net.ParseIP(nodeIP)}
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, p256)
	if err != nil {
		f.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}
