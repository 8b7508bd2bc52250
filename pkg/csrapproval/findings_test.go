package csrapproval

import (
	"crypto"
	"crypto/x509"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The findings of issue 46, each as the attacker would make it.

// A tenant who may create service accounts and certificate requests in
// their own namespace names a service account node-bootstrapper and asks
// for a pending node's client certificate.
func TestFindingTenantServiceAccountIsNoBootstrapper(t *testing.T) {
	csr := clientCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
		c.Spec.Username = "system:serviceaccount:tenant-a:node-bootstrapper"
		c.Spec.Groups = []string{"system:serviceaccounts", "system:serviceaccounts:tenant-a", "system:authenticated"}
		return nil
	})
	if d := judgeDefault(ReadRequest(csr), clientFacts(nil)); d.Verdict == Approve {
		t.Fatalf("a tenant's node-bootstrapper service account got a node's client certificate: %s", d.Message)
	}
}

// Before the NodeClaim registered, the only link from a Node to it is the
// Node's providerID, which the kubelet writes itself: node "evil" claims the
// victim's providerID and asks for a serving certificate with the victim's
// names and addresses.
func TestFindingServingCertificateForAForeignNodeBeforeRegistration(t *testing.T) {
	const evil = "ip-10-0-9-9.ec2.internal"
	csr := servingCSR(t, func(c *certificatesv1.CertificateSigningRequest, x *x509.CertificateRequest) crypto.Signer {
		c.Spec.Username = NodeUserPrefix + evil
		x.Subject = subject(evil)
		return nil
	})
	f := servingFacts(func(f *Facts) { f.NodeClaim.Registered, f.NodeClaim.NodeName = false, "" })
	if d := judgeDefault(ReadRequest(csr), f); d.Verdict == Approve {
		t.Fatalf("node %s got a serving certificate for Machine %s's names: %s", evil, f.Machine.Key, d.Message)
	}
}

func judgeDefault(r Request, f Facts) Decision { return Judge(Policy{}, r, f) }

// A bootstrap-token holder (here another Machine's token) files a request
// for a predictable node name before the kubelet boots. It must not be
// approved in the kubelet's place, and the kubelet's own request, filed
// later with its Machine's token, must be.
func TestFindingFirstRequestDoesNotLockTheKubeletOut(t *testing.T) {
	const machineToken, otherToken = "kub3lt", "att4ck"
	attacker := clientCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
		c.Name, c.Spec.Username = "csr-attacker", BootstrapTokenUserPrefix+otherToken
		return nil
	})
	kubelet := clientCSR(t, func(c *certificatesv1.CertificateSigningRequest, _ *x509.CertificateRequest) crypto.Signer {
		c.Name, c.Spec.Username = "csr-kubelet", BootstrapTokenUserPrefix+machineToken
		c.CreationTimestamp = metav1.NewTime(requested.Add(time.Minute))
		return nil
	})
	withToken := func(others ...*certificatesv1.CertificateSigningRequest) Facts {
		return clientFacts(func(f *Facts) {
			f.Machines[0].Machine.BootstrapTokenID = machineToken
			for _, o := range others {
				f.Others = append(f.Others, ReadRequest(o))
			}
		})
	}
	if d := judgeDefault(ReadRequest(attacker), withToken()); d.Verdict == Approve {
		t.Fatalf("the attacker's request, filed first with another token, was approved: %s", d.Message)
	}
	if d := judgeDefault(ReadRequest(kubelet), withToken(attacker)); d.Verdict != Approve {
		t.Fatalf("the kubelet's request with its Machine's token, after the attacker's, was not approved: %s/%s %s", d.Verdict, d.Reason, d.Message)
	}
}
