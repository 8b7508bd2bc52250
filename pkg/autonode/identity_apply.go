package autonode

import (
	"context"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/operator/crds"
)

// InstallCRDs installs the Karpenter and NodeClass CRDs in a workload
// cluster, with its admin kubeconfig.
type InstallCRDs func(ctx context.Context, kubeconfig []byte) error

// NewInstallCRDs is the default InstallCRDs: the CRDs the provider of this
// version serves. AutoNode installs them so that the provider's own
// identity needs no right to write CRDs.
func NewInstallCRDs(ctx context.Context, kubeconfig []byte) error {
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return fmt.Errorf("reading the kubeconfig: %w", err)
	}
	cfg.UserAgent = ManagedBy
	if err := crds.Install(ctx, cfg); err != nil {
		return fmt.Errorf("installing the Karpenter and NodeClass CRDs in the workload cluster: %w", err)
	}
	return nil
}

// ensureWorkloadIdentity applies the provider's ServiceAccount and RBAC in
// the workload cluster (removing the CSR approver's when not asked for),
// installs the CRDs on a first start or a new version, and keeps a valid
// token of that ServiceAccount in the token Secret. It returns how soon the
// token must be renewed.
func (r *Reconciler) ensureWorkloadIdentity(ctx context.Context, c *clusterv1.Cluster, s Settings, admin []byte, installCRDs bool) (time.Duration, error) {
	wl, err := r.Workload(admin)
	if err != nil {
		return 0, fmt.Errorf("workload cluster: %w", err)
	}
	grant, revoke, err := WorkloadIdentity(s.ApproveKubeletCSRs)
	if err != nil {
		return 0, err
	}
	for _, obj := range grant {
		if err := notSomeoneElses(ctx, wl, obj); err != nil {
			return 0, err
		}
		if err := wl.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
			return 0, fmt.Errorf("applying %s %s in the workload cluster: %w", obj.GetKind(), objectKey(obj), err)
		}
	}
	if err := deleteOwn(ctx, wl, revoke); err != nil {
		return 0, err
	}
	if installCRDs {
		install := r.InstallCRDs
		if install == nil {
			install = NewInstallCRDs
		}
		if err := install(ctx, admin); err != nil {
			return 0, err
		}
	}
	kubeconfig, err := WorkloadKubeconfig(admin)
	if err != nil {
		return 0, fmt.Errorf("Secret %s/%s: %w", c.Namespace, KubeconfigSecretName(c), err)
	}
	sa := &corev1.ServiceAccount{}
	if err := wl.Get(ctx, client.ObjectKey{Namespace: WorkloadNamespace, Name: WorkloadServiceAccount}, sa); err != nil {
		return 0, fmt.Errorf("reading ServiceAccount %s/%s in the workload cluster: %w", WorkloadNamespace, WorkloadServiceAccount, err)
	}
	old := &corev1.Secret{}
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: TokenSecretName(c)}, old); err != nil {
		if !apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("reading Secret %s/%s: %w", c.Namespace, TokenSecretName(c), err)
		}
		old = nil
	}
	token := TokenOf(old)
	renew, after := TokenRenewal(r.Now(), token, string(sa.UID))
	if renew {
		tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(TokenLifetime / time.Second))}}
		issued := r.Now()
		if err := wl.SubResource("token").Create(ctx, sa, tr); err != nil {
			return 0, fmt.Errorf("requesting a token of ServiceAccount %s/%s in the workload cluster: %w", WorkloadNamespace, WorkloadServiceAccount, err)
		}
		token = Token{Value: tr.Status.Token, Issued: issued.Truncate(time.Second), Expires: tr.Status.ExpirationTimestamp.Time, ServiceAccountUID: string(sa.UID)}
		if _, after = TokenRenewal(r.Now(), token, token.ServiceAccountUID); after <= 0 {
			return 0, fmt.Errorf("the workload cluster issued a token of ServiceAccount %s/%s that expires at %s, too soon", WorkloadNamespace, WorkloadServiceAccount, token.Expires)
		}
	}
	if err := r.applyObject(ctx, tokenSecret(c, kubeconfig, token)); err != nil {
		return 0, err
	}
	return after, nil
}

// notSomeoneElses refuses to take over a workload object of the same name
// that AutoNode did not create (a hand-installed provider's RBAC).
func notSomeoneElses(ctx context.Context, wl client.Client, obj *unstructured.Unstructured) error {
	cur := &unstructured.Unstructured{}
	cur.SetGroupVersionKind(obj.GroupVersionKind())
	err := wl.Get(ctx, client.ObjectKeyFromObject(obj), cur)
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("reading %s %s in the workload cluster: %w", obj.GetKind(), objectKey(obj), err)
	case cur.GetLabels()[ManagedByLabel] != ManagedBy:
		return fmt.Errorf("%s %s in the workload cluster is not AutoNode's (no label %s=%s): remove it, or the hand-installed provider it belongs to", obj.GetKind(), objectKey(obj), ManagedByLabel, ManagedBy)
	}
	return nil
}

// deleteOwn deletes those of objs that exist with AutoNode's label, each at
// the version read.
func deleteOwn(ctx context.Context, wl client.Client, objs []*unstructured.Unstructured) error {
	for _, obj := range objs {
		cur := &unstructured.Unstructured{}
		cur.SetGroupVersionKind(obj.GroupVersionKind())
		err := wl.Get(ctx, client.ObjectKeyFromObject(obj), cur)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("reading %s %s in the workload cluster: %w", obj.GetKind(), objectKey(obj), err)
		}
		if cur.GetLabels()[ManagedByLabel] != ManagedBy {
			continue
		}
		err = wl.Delete(ctx, cur, client.Preconditions{UID: ptr.To(cur.GetUID())}, client.PropagationPolicy(metav1.DeletePropagationBackground))
		if client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting %s %s in the workload cluster: %w", obj.GetKind(), objectKey(obj), err)
		}
	}
	return nil
}

// removeWorkloadIdentity deletes AutoNode's ServiceAccount and RBAC in the
// workload cluster (those carrying its label).
func (r *Reconciler) removeWorkloadIdentity(ctx context.Context, admin []byte) error {
	wl, err := r.Workload(admin)
	if err != nil {
		return fmt.Errorf("workload cluster: %w", err)
	}
	grant, revoke, err := WorkloadIdentity(false)
	if err != nil {
		return err
	}
	return deleteOwn(ctx, wl, append(grant, revoke...))
}

func objectKey(o client.Object) string {
	if o.GetNamespace() == "" {
		return o.GetName()
	}
	return o.GetNamespace() + "/" + o.GetName()
}
