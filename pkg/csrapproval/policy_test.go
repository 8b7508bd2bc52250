package csrapproval

import (
	"crypto"
	"crypto/x509"
	"net"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// The trust model of docs/concepts.md#kubelet-certificate-requests, row
// by row: who may ask, what binds the request to the Machine, and what an
// attacker tries instead.
func TestTrustModel(t *testing.T) {
	const token = "kub3lt"
	tenantSA := "system:serviceaccount:tenant-a:node-bootstrapper"
	saGroups := []string{ServiceAccountsGroup, "system:serviceaccounts:tenant-a", "system:authenticated"}
	as := func(user string, groups ...string) func(*certificatesv1.CertificateSigningRequest, *x509.CertificateRequest) crypto.Signer {
		return func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
			c.Spec.Username, c.Spec.Groups = user, groups
			return nil
		}
	}
	other := func(name, user string, created time.Time) Request {
		return ReadRequest(clientCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
			c.Name, c.Spec.Username, c.CreationTimestamp = name, user, metav1.NewTime(created)
			return nil
		}))
	}
	tokenFacts := func(mutate func(*Facts)) Facts {
		return clientFacts(func(f *Facts) {
			f.Machines[0].Machine.BootstrapTokenID = token
			if mutate != nil {
				mutate(f)
			}
		})
	}
	cases := []struct {
		name   string
		policy Policy
		csr    *certificatesv1.CertificateSigningRequest
		facts  Facts
		want   Verdict
		reason string
	}{
		// Identities.
		{name: "a listed service account", policy: Policy{BootstrapServiceAccounts: []string{"tenant-a/node-bootstrapper"}},
			csr: clientCSR(t, as(tenantSA, saGroups...)), facts: clientFacts(nil), want: Approve, reason: ReasonApproved},
		{name: "a service account of the listed name in another namespace", policy: Policy{BootstrapServiceAccounts: []string{"machine-config/node-bootstrapper"}},
			csr: clientCSR(t, as(tenantSA, saGroups...)), facts: clientFacts(nil), want: Refuse, reason: ReasonIdentity},
		{name: "a listed service account's name without the service accounts group", policy: Policy{BootstrapServiceAccounts: []string{"tenant-a/node-bootstrapper"}},
			csr: clientCSR(t, as(tenantSA, "system:authenticated")), facts: clientFacts(nil), want: Refuse, reason: ReasonIdentity},
		{name: "a bootstrap token ID of the wrong shape", csr: clientCSR(t, as("system:bootstrap:ABCDEF", BootstrappersGroup)), facts: clientFacts(nil), want: Refuse, reason: ReasonIdentity},
		{name: "SubjectAccessReview allows", policy: Policy{SubjectAccessReview: true}, csr: clientCSR(t, as(tenantSA, saGroups...)),
			facts: clientFacts(func(f *Facts) { f.Authorized = map[string]bool{csrName: true} }), want: Approve, reason: ReasonApproved},
		{name: "SubjectAccessReview denies a bootstrap token", policy: Policy{SubjectAccessReview: true}, csr: clientCSR(t, nil),
			facts: clientFacts(func(f *Facts) { f.Authorized = map[string]bool{csrName: false} }), want: Refuse, reason: ReasonIdentity},

		// Binding to the Machine: its KubeadmConfig's token.
		{name: "the Machine's own bootstrap token", csr: clientCSR(t, as(BootstrapTokenUserPrefix+token, BootstrappersGroup)), facts: tokenFacts(nil), want: Approve, reason: ReasonApproved},
		{name: "another Machine's bootstrap token", csr: clientCSR(t, nil), facts: tokenFacts(nil), want: Refuse, reason: ReasonNotTheMachinesToken},
		{name: "a listed service account for a Machine with a token", policy: Policy{BootstrapServiceAccounts: []string{"tenant-a/node-bootstrapper"}},
			csr: clientCSR(t, as(tenantSA, saGroups...)), facts: tokenFacts(nil), want: Refuse, reason: ReasonNotTheMachinesToken},
		{name: "SubjectAccessReview allows another token for a Machine with a token", policy: Policy{SubjectAccessReview: true}, csr: clientCSR(t, nil),
			facts: tokenFacts(func(f *Facts) { f.Authorized = map[string]bool{csrName: true} }), want: Refuse, reason: ReasonNotTheMachinesToken},
		{name: "the Machine's KubeadmConfig is missing", csr: clientCSR(t, nil),
			facts: clientFacts(func(f *Facts) { f.Machines[0].Machine.BootstrapMissing = "KubeadmConfig default/x" }), want: Refuse, reason: ReasonBootstrapUnreadable},

		// The time window: never older than the Machine.
		{name: "a request older than the Machine", csr: clientCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
			c.CreationTimestamp = metav1.NewTime(machineCreated.Add(-time.Second))
			return nil
		}), facts: clientFacts(nil), want: Refuse, reason: ReasonOlderThanMachine},
		{name: "a request older than the Machine, with its token", csr: clientCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
			c.Spec.Username, c.CreationTimestamp = BootstrapTokenUserPrefix+token, metav1.NewTime(machineCreated.Add(-time.Second))
			return nil
		}), facts: tokenFacts(nil), want: Refuse, reason: ReasonOlderThanMachine},

		// Competing requests.
		{name: "shared identity: another eligible request pending", csr: clientCSR(t, nil),
			facts: clientFacts(func(f *Facts) { f.Others = []Request{other("csr-early", bootUser, requested.Add(-time.Second))} }), want: Refuse, reason: ReasonCompeting},
		{name: "shared identity: the other pending request is older than the Machine", csr: clientCSR(t, nil),
			facts: clientFacts(func(f *Facts) { f.Others = []Request{other("csr-early", bootUser, machineCreated.Add(-time.Hour))} }), want: Approve, reason: ReasonApproved},
		{name: "per-Machine token: the other pending request is another token's", csr: clientCSR(t, as(BootstrapTokenUserPrefix+token, BootstrappersGroup)),
			facts: tokenFacts(func(f *Facts) { f.Others = []Request{other("csr-early", bootUser, requested.Add(-time.Second))} }), want: Approve, reason: ReasonApproved},
		{name: "per-Machine token: two requests with the Machine's token", csr: clientCSR(t, as(BootstrapTokenUserPrefix+token, BootstrappersGroup)),
			facts: tokenFacts(func(f *Facts) {
				f.Others = []Request{other("csr-early", BootstrapTokenUserPrefix+token, requested.Add(-time.Second))}
			}), want: Refuse, reason: ReasonCompeting},
		{name: "the recorded request is approved again though another competes", csr: clientCSR(t, nil), facts: clientFacts(func(f *Facts) {
			f.Machines[0].NodeClaim.ApprovedClientCSR = csrName
			f.Others = []Request{other("csr-late", bootUser, requested.Add(time.Second))}
		}), want: Approve, reason: ReasonApproved},

		// The record of the approved request.
		{name: "recorded request pending (an approval under way)", csr: clientCSR(t, nil), facts: clientFacts(func(f *Facts) {
			f.Machines[0].NodeClaim.ApprovedClientCSR, f.Machines[0].NodeClaim.ApprovedClientCSRState = "csr-0", RecordPending
		}), want: Refuse, reason: ReasonAlreadyApproved},
		{name: "recorded request gone or denied: the record binds nothing", csr: clientCSR(t, nil), facts: clientFacts(func(f *Facts) {
			f.Machines[0].NodeClaim.ApprovedClientCSR, f.Machines[0].NodeClaim.ApprovedClientCSRState = "csr-0", RecordVoid
		}), want: Approve, reason: ReasonApproved},

		// Canonical names.
		{name: "client: upper-case node name", csr: clientCSR(t, func(_ *certificatesv1.CertificateSigningRequest, x *x509.CertificateRequest) crypto.Signer {
			x.Subject = subject("IP-10-0-1-7.ec2.internal")
			return nil
		}), facts: clientFacts(nil), want: Refuse, reason: ReasonSubject},
		{name: "client: node name with a trailing dot", csr: clientCSR(t, func(_ *certificatesv1.CertificateSigningRequest, x *x509.CertificateRequest) crypto.Signer {
			x.Subject = subject(node + ".")
			return nil
		}), facts: clientFacts(nil), want: Refuse, reason: ReasonSubject},
		{name: "shared identity: a competitor with a trailing dot is no candidate", csr: clientCSR(t, nil), facts: clientFacts(func(f *Facts) {
			o := ReadRequest(clientCSR(t, func(c *certificatesv1.CertificateSigningRequest, x *x509.CertificateRequest) crypto.Signer {
				c.Name, x.Subject = "csr-dot", subject(node+".")
				return nil
			}))
			f.Others = []Request{o}
		}), want: Approve, reason: ReasonApproved},
		{name: "serving: SAN differing from the Machine's name in case and a trailing dot", csr: servingCSR(t, func(_ *certificatesv1.CertificateSigningRequest, x *x509.CertificateRequest) crypto.Signer {
			x.DNSNames = []string{"IP-10-0-1-7.EC2.INTERNAL."}
			return nil
		}), facts: servingFacts(nil), want: Approve, reason: ReasonApproved},
		{name: "serving: the Machine reports its name in upper case", csr: servingCSR(t, nil), facts: servingFacts(func(f *Facts) {
			f.Machine.Addresses[1].Address = "IP-10-0-1-7.EC2.Internal."
		}), want: Approve, reason: ReasonApproved},

		// Serving requests: the node name and the address types.
		{name: "serving: a node name that is only the Machine's ExternalDNS", csr: servingCSR(t, nil), facts: servingFacts(func(f *Facts) {
			f.Machine.Addresses[1].Type = clusterv1.MachineExternalDNS
		}), want: Refuse, reason: ReasonNameNotOnMachine},
		{name: "serving: the Machine's ExternalIP", csr: servingCSR(t, func(_ *certificatesv1.CertificateSigningRequest, x *x509.CertificateRequest) crypto.Signer {
			x.IPAddresses = append(x.IPAddresses, net.ParseIP("54.1.2.3"))
			return nil
		}), facts: servingFacts(func(f *Facts) {
			f.Machine.Addresses = append(f.Machine.Addresses, clusterv1.MachineAddress{Type: clusterv1.MachineExternalIP, Address: "54.1.2.3"})
		}), want: Refuse, reason: ReasonAddressNotOnMachine},
		{name: "serving: the Machine's ExternalIP, external addresses allowed", policy: Policy{ServingExternalAddresses: true},
			csr: servingCSR(t, func(_ *certificatesv1.CertificateSigningRequest, x *x509.CertificateRequest) crypto.Signer {
				x.IPAddresses = append(x.IPAddresses, net.ParseIP("54.1.2.3"))
				return nil
			}), facts: servingFacts(func(f *Facts) {
				f.Machine.Addresses = append(f.Machine.Addresses, clusterv1.MachineAddress{Type: clusterv1.MachineExternalIP, Address: "54.1.2.3"})
			}), want: Approve, reason: ReasonApproved},
		{name: "serving: kubernetes.default.svc reported as the Machine's ExternalDNS", csr: servingCSR(t, func(_ *certificatesv1.CertificateSigningRequest, x *x509.CertificateRequest) crypto.Signer {
			x.DNSNames = append(x.DNSNames, "kubernetes.default.svc")
			return nil
		}), facts: servingFacts(func(f *Facts) {
			f.Machine.Addresses = append(f.Machine.Addresses, clusterv1.MachineAddress{Type: clusterv1.MachineExternalDNS, Address: "kubernetes.default.svc"})
		}), want: Refuse, reason: ReasonAddressNotOnMachine},
		{name: "serving: registered NodeClaim's node, its Machine's name", csr: servingCSR(t, nil), facts: servingFacts(func(f *Facts) {
			f.NodeClaim.NodeName = node
		}), want: Approve, reason: ReasonApproved},
		{name: "serving: upper-case node identity", csr: servingCSR(t, func(c *certificatesv1.CertificateSigningRequest, x *x509.CertificateRequest) crypto.Signer {
			c.Spec.Username, x.Subject = NodeUserPrefix+"IP-10-0-1-7.ec2.internal", subject("IP-10-0-1-7.ec2.internal")
			return nil
		}), facts: servingFacts(nil), want: Refuse, reason: ReasonSubject},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Judge(tc.policy, ReadRequest(tc.csr), tc.facts)
			if got.Verdict != tc.want || got.Reason != tc.reason {
				t.Fatalf("Judge = %s/%s (%s), want %s/%s", got.Verdict, got.Reason, got.Message, tc.want, tc.reason)
			}
		})
	}
}

func TestTokenID(t *testing.T) {
	for token, want := range map[string]string{
		"abcdef.0123456789abcdef": "abcdef",
		"abcdef":                  "",
		"ABCDEF.0123456789abcdef": "",
		"abcde.0123456789abcdef":  "",
		"abcdef.0123":             "",
		"":                        "",
	} {
		if got := TokenID(token); got != want {
			t.Errorf("TokenID(%q) = %q, want %q", token, got, want)
		}
	}
}
