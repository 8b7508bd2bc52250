package autonode

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// The provider's identity in the workload cluster: a ServiceAccount of its
// own, bound to the provider's workload ClusterRoles (config/rbac/workload,
// and config/rbac/csr-approver when approve-kubelet-csrs is true). AutoNode
// applies them with Cluster API's admin kubeconfig, which only the AutoNode
// controller reads; the provider gets a token of that ServiceAccount.
const (
	WorkloadNamespace      = "kube-system"
	WorkloadServiceAccount = providerName
	// TokenLifetime is the lifetime AutoNode requests for the provider's
	// workload token; it is renewed once half of it is gone.
	TokenLifetime = time.Hour
	// Annotations of the token Secret: when its token was issued and
	// expires, and the UID of the ServiceAccount it was issued for.
	tokenIssuedAnnotation  = annotationPrefix + "token-issued"
	tokenExpiresAnnotation = annotationPrefix + "token-expires"
	tokenSAUIDAnnotation   = annotationPrefix + "token-service-account-uid"
)

// workloadRBAC is a copy of config/rbac/workload and config/rbac/csr-approver
// made by `make generate` (go:embed cannot reach config/); a test keeps the
// copies equal, so the rules are the provider's RBAC markers' and core's.
//
//go:embed workloadrbac/*.yaml
var workloadRBAC embed.FS

// csrApproverPrefix marks the files granted only with approve-kubelet-csrs.
const csrApproverPrefix = "csr-approver-"

// WorkloadIdentity is what AutoNode applies in the workload cluster (grant)
// and what it removes there (revoke: the CSR approver's rules when the
// setting is false), each object labelled as AutoNode's.
func WorkloadIdentity(approveKubeletCSRs bool) (grant, revoke []*unstructured.Unstructured, err error) {
	sa := &unstructured.Unstructured{}
	sa.SetAPIVersion("v1")
	sa.SetKind("ServiceAccount")
	sa.SetNamespace(WorkloadNamespace)
	sa.SetName(WorkloadServiceAccount)
	sa.SetLabels(workloadLabels())
	grant = append(grant, sa)
	files, err := workloadRBAC.ReadDir("workloadrbac")
	if err != nil {
		return nil, nil, err
	}
	for _, f := range files {
		raw, err := workloadRBAC.ReadFile(path.Join("workloadrbac", f.Name()))
		if err != nil {
			return nil, nil, err
		}
		objs, err := decodeRBAC(raw)
		if err != nil {
			return nil, nil, fmt.Errorf("workload RBAC %s: %w", f.Name(), err)
		}
		if strings.HasPrefix(f.Name(), csrApproverPrefix) && !approveKubeletCSRs {
			revoke = append(revoke, objs...)
		} else {
			grant = append(grant, objs...)
		}
	}
	return grant, revoke, nil
}

func workloadLabels() map[string]string {
	return map[string]string{nameLabel: providerName, ManagedByLabel: ManagedBy}
}

// decodeRBAC reads a file of RBAC objects: namespaced ones without a
// namespace, and ServiceAccount subjects, go to WorkloadNamespace.
func decodeRBAC(raw []byte) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		obj := map[string]any{}
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		switch u.GetKind() {
		case "ClusterRole", "ClusterRoleBinding":
		case "Role", "RoleBinding":
			if u.GetNamespace() == "" {
				u.SetNamespace(WorkloadNamespace)
			}
		default:
			return nil, fmt.Errorf("%s %s: not an RBAC kind", u.GetKind(), u.GetName())
		}
		if subjects, ok := obj["subjects"].([]any); ok {
			for _, s := range subjects {
				if m, ok := s.(map[string]any); ok && m["kind"] == "ServiceAccount" {
					if m["name"] != WorkloadServiceAccount {
						return nil, fmt.Errorf("%s %s: subject ServiceAccount %v is not %s", u.GetKind(), u.GetName(), m["name"], WorkloadServiceAccount)
					}
					m["namespace"] = WorkloadNamespace
				}
			}
		}
		labels := u.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		for k, v := range workloadLabels() {
			labels[k] = v
		}
		u.SetLabels(labels)
		out = append(out, u)
	}
}

// TokenSecretName is the Secret in the Cluster's namespace holding the
// provider's workload kubeconfig and token (keys "kubeconfig", "token").
func TokenSecretName(c *clusterv1.Cluster) string { return ObjectName(c) + "-workload" }

// Token is a workload token as the token Secret records it.
type Token struct {
	Value             string
	Issued, Expires   time.Time
	ServiceAccountUID string
}

// TokenOf reads the token of an existing token Secret; a zero Token when
// there is none or it is unreadable (then it is renewed).
func TokenOf(s *corev1.Secret) Token {
	if s == nil {
		return Token{}
	}
	issued, err1 := time.Parse(time.RFC3339, s.Annotations[tokenIssuedAnnotation])
	expires, err2 := time.Parse(time.RFC3339, s.Annotations[tokenExpiresAnnotation])
	if err1 != nil || err2 != nil || len(s.Data["token"]) == 0 {
		return Token{}
	}
	return Token{Value: string(s.Data["token"]), Issued: issued, Expires: expires, ServiceAccountUID: s.Annotations[tokenSAUIDAnnotation]}
}

// TokenRenewal decides whether the provider's workload token must be
// requested again now: there is none, it was issued for another
// ServiceAccount (deleted and recreated), half of its lifetime is gone, or
// its times make no sense. Otherwise after is how long until it must.
func TokenRenewal(now time.Time, t Token, serviceAccountUID string) (renew bool, after time.Duration) {
	if t.Value == "" || t.ServiceAccountUID != serviceAccountUID || !t.Expires.After(t.Issued) || now.Before(t.Issued.Add(-time.Minute)) {
		return true, 0
	}
	due := t.Issued.Add(t.Expires.Sub(t.Issued) / 2)
	if !now.Before(due) {
		return true, 0
	}
	return false, due.Sub(now)
}

// tokenSecret holds the provider's workload kubeconfig and its token,
// owned by the Cluster.
func tokenSecret(c *clusterv1.Cluster, kubeconfig []byte, t Token) *corev1.Secret {
	m := objectMeta(c)
	m.Name = TokenSecretName(c)
	m.Annotations = map[string]string{
		tokenIssuedAnnotation:  t.Issued.UTC().Format(time.RFC3339),
		tokenExpiresAnnotation: t.Expires.UTC().Format(time.RFC3339),
		tokenSAUIDAnnotation:   t.ServiceAccountUID,
	}
	return &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: m,
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{"kubeconfig": kubeconfig, "token": []byte(t.Value)},
	}
}

// WorkloadKubeconfig is the provider's kubeconfig of the workload cluster:
// the server and CA of Cluster API's admin kubeconfig, and a tokenFile
// (the mounted token, which client-go re-reads, so a renewed token is
// used without a restart) instead of the admin's credentials.
func WorkloadKubeconfig(admin []byte) ([]byte, error) {
	cfg, err := clientcmd.Load(admin)
	if err != nil {
		return nil, fmt.Errorf("reading the kubeconfig: %w", err)
	}
	var cluster *clientcmdapi.Cluster
	if ctx, ok := cfg.Contexts[cfg.CurrentContext]; ok {
		cluster = cfg.Clusters[ctx.Cluster]
	} else if len(cfg.Clusters) == 1 {
		for _, c := range cfg.Clusters {
			cluster = c
		}
	}
	if cluster == nil || cluster.Server == "" {
		names := make([]string, 0, len(cfg.Clusters))
		for n := range cfg.Clusters {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("the kubeconfig's current context %q names no cluster with a server (clusters %v)", cfg.CurrentContext, names)
	}
	if cluster.CertificateAuthority != "" && len(cluster.CertificateAuthorityData) == 0 {
		return nil, fmt.Errorf("cluster %s: certificate-authority is a file (%s); need certificate-authority-data", cluster.Server, cluster.CertificateAuthority)
	}
	out := clientcmdapi.NewConfig()
	out.Clusters["workload"] = &clientcmdapi.Cluster{
		Server: cluster.Server, CertificateAuthorityData: cluster.CertificateAuthorityData,
		TLSServerName: cluster.TLSServerName, ProxyURL: cluster.ProxyURL, InsecureSkipTLSVerify: cluster.InsecureSkipTLSVerify,
	}
	out.AuthInfos[providerName] = &clientcmdapi.AuthInfo{TokenFile: SpokeKubeconfigDir + "/token"}
	out.Contexts["workload"] = &clientcmdapi.Context{Cluster: "workload", AuthInfo: providerName, Namespace: WorkloadNamespace}
	out.CurrentContext = "workload"
	return clientcmd.Write(*out)
}
