package autonode

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

func TestTokenRenewal(t *testing.T) {
	issued := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	fresh := Token{Value: "t", Issued: issued, Expires: issued.Add(time.Hour), ServiceAccountUID: "sa-1"}
	cases := []struct {
		name      string
		now       time.Time
		token     Token
		uid       string
		renew     bool
		wantAfter time.Duration
	}{
		{"no token yet", issued, Token{}, "sa-1", true, 0},
		{"just issued: renewed at half its lifetime", issued, fresh, "sa-1", false, 30 * time.Minute},
		{"a quarter gone", issued.Add(15 * time.Minute), fresh, "sa-1", false, 15 * time.Minute},
		{"half gone: renewed well before it expires", issued.Add(30 * time.Minute), fresh, "sa-1", true, 0},
		{"expired", issued.Add(2 * time.Hour), fresh, "sa-1", true, 0},
		{"its ServiceAccount was recreated", issued, fresh, "sa-2", true, 0},
		{"a short lifetime the API server capped: half of it", issued, Token{Value: "t", Issued: issued, Expires: issued.Add(20 * time.Minute), ServiceAccountUID: "sa-1"}, "sa-1", false, 10 * time.Minute},
		{"expires before it was issued", issued, Token{Value: "t", Issued: issued, Expires: issued, ServiceAccountUID: "sa-1"}, "sa-1", true, 0},
		{"issued in the future (clock moved back)", issued.Add(-time.Hour), fresh, "sa-1", true, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			renew, after := TokenRenewal(c.now, c.token, c.uid)
			if renew != c.renew || after != c.wantAfter {
				t.Errorf("TokenRenewal = %v, %s; want %v, %s", renew, after, c.renew, c.wantAfter)
			}
		})
	}
}

func TestTokenOfReadsWhatTokenSecretWrote(t *testing.T) {
	cl := cluster(map[string]string{EnabledLabel: Enabled}, nil)
	issued := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	want := Token{Value: "tok", Issued: issued, Expires: issued.Add(TokenLifetime), ServiceAccountUID: "uid"}
	s := tokenSecret(cl, []byte("kc"), want)
	if got := TokenOf(s); got != want {
		t.Errorf("TokenOf = %+v, want %+v", got, want)
	}
	s.Annotations[tokenExpiresAnnotation] = "soon"
	if got := TokenOf(s); got.Value != "" {
		t.Errorf("an unreadable expiry gives %+v, want no token (renewed)", got)
	}
	if s.OwnerReferences[0].UID != cl.UID || s.Labels[ManagedByLabel] != ManagedBy {
		t.Errorf("token Secret not owned by the Cluster or not labelled: %+v", s.ObjectMeta)
	}
}

func TestWorkloadKubeconfigKeepsServerAndCADropsAdmin(t *testing.T) {
	admin := []byte(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority-data: Q0EK
users:
- name: admin
  user:
    client-certificate-data: Q0VSVAo=
    client-key-data: S0VZCg==
contexts:
- name: admin@c
  context: {cluster: c, user: admin}
current-context: admin@c
`)
	out, err := WorkloadKubeconfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	cur := cfg.Contexts[cfg.CurrentContext]
	cluster, user := cfg.Clusters[cur.Cluster], cfg.AuthInfos[cur.AuthInfo]
	if cluster.Server != "https://10.0.0.1:6443" || string(cluster.CertificateAuthorityData) != "CA\n" {
		t.Errorf("cluster %+v: want the admin kubeconfig's server and CA", cluster)
	}
	if user.TokenFile != SpokeKubeconfigDir+"/token" || len(user.ClientKeyData) > 0 || len(user.ClientCertificateData) > 0 || user.Token != "" {
		t.Errorf("user %+v: want only tokenFile %s/token", user, SpokeKubeconfigDir)
	}
	if _, err := WorkloadKubeconfig([]byte("apiVersion: v1\nkind: Config\ncurrent-context: x\n")); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("a kubeconfig without a server: %v, want an error naming its context", err)
	}
}

// The embedded RBAC is config/rbac's, and AutoNode's labels and namespace
// are put on every object; the CSR approver's rules only when asked.
func TestWorkloadIdentity(t *testing.T) {
	files, err := workloadRBAC.ReadDir("workloadrbac")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		dir, name, _ := strings.Cut(f.Name(), "-")
		if strings.HasPrefix(f.Name(), csrApproverPrefix) {
			dir, name = "csr-approver", strings.TrimPrefix(f.Name(), csrApproverPrefix)
		}
		want, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", dir, name))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := workloadRBAC.ReadFile("workloadrbac/" + f.Name())
		if !bytes.Equal(got, want) {
			t.Errorf("workloadrbac/%s differs from config/rbac/%s/%s: run make generate", f.Name(), dir, name)
		}
	}
	names := func(approve bool) (grant, revoke []string) {
		g, r, err := WorkloadIdentity(approve)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range g {
			if o.GetLabels()[ManagedByLabel] != ManagedBy {
				t.Errorf("%s %s is not labelled as AutoNode's", o.GetKind(), o.GetName())
			}
			if (o.GetKind() == "Role" || o.GetKind() == "RoleBinding" || o.GetKind() == "ServiceAccount") && o.GetNamespace() == "" {
				t.Errorf("%s %s has no namespace", o.GetKind(), o.GetName())
			}
			grant = append(grant, o.GetKind()+"/"+o.GetName())
		}
		for _, o := range r {
			revoke = append(revoke, o.GetKind()+"/"+o.GetName())
		}
		return grant, revoke
	}
	g, r := names(false)
	if strings.Contains(strings.Join(g, " "), "csr-approver") || len(r) != 2 {
		t.Errorf("without approve-kubelet-csrs: grant %v, revoke %v", g, r)
	}
	g, r = names(true)
	if !strings.Contains(strings.Join(g, " "), "ClusterRoleBinding/karpenter-clusterapi-csr-approver") || len(r) != 0 {
		t.Errorf("with approve-kubelet-csrs: grant %v, revoke %v", g, r)
	}
}

// A deleted or changed token Secret brings its Cluster back at once.
func TestTokenSecretMapsToItsCluster(t *testing.T) {
	cl := cluster(map[string]string{EnabledLabel: Enabled}, nil)
	s := tokenSecret(cl, nil, Token{})
	got := clusterOfKubeconfig(context.Background(), s)
	if len(got) != 1 || got[0].Name != cl.Name || got[0].Namespace != cl.Namespace {
		t.Errorf("token Secret %s maps to %v", s.Name, got)
	}
	s.Name = "other-karpenter-workload"
	if got := clusterOfKubeconfig(context.Background(), s); len(got) != 0 {
		t.Errorf("another name maps to %v", got)
	}
}
