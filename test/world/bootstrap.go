package world

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/yaml"
)

// UnregisteredTaint is the taint Karpenter expects Nodes to register with.
var UnregisteredTaint = corev1.Taint{Key: "karpenter.sh/unregistered", Effect: corev1.TaintEffectNoExecute}

// BootstrapData is what the simulated kubelet reads from a bootstrap data
// Secret (key "value"), standing in for the cloud-init / user data a real
// bootstrap provider renders. The simulated AWS passes it to the instance at
// launch, like CAPA passes bootstrap data as EC2 user data.
type BootstrapData struct {
	// Taints the kubelet registers the Node with (--register-with-taints).
	Taints []corev1.Taint `json:"taints,omitempty"`
	// Labels the kubelet registers the Node with (--node-labels).
	Labels map[string]string `json:"labels,omitempty"`
	// KubeletArgs are extra kubelet flags without the leading "--". The
	// simulated kubelet honours max-pods, kube-reserved, system-reserved and
	// eviction-hard (see NodeAllocatable); the rest are kept for tests to
	// inspect.
	KubeletArgs map[string]string `json:"kubeletArgs,omitempty"`
	// BootstrapToken is the kubeadm bootstrap token ("<id>.<secret>") the
	// kubelet joins with, as CABPK renders a Machine's own token into its
	// cloud-init: a JoinWithCSR kubelet asks for its client certificate as
	// system:bootstrap:<id>. Empty (a shared data Secret): it asks as
	// BootstrapTokenUser, the token every such kubelet shares.
	BootstrapToken string `json:"bootstrapToken,omitempty"`
}

// DefaultBootstrapData is the content of the world's "<cluster>-bootstrap"
// Secret: register with Karpenter's unregistered taint, no extra labels.
func DefaultBootstrapData() BootstrapData {
	return BootstrapData{Taints: []corev1.Taint{UnregisteredTaint}, Labels: map[string]string{}}
}

// RenderBootstrapData renders bootstrap data as the YAML stored under the
// Secret key "value".
func RenderBootstrapData(d BootstrapData) ([]byte, error) {
	return yaml.Marshal(d)
}

// ParseBootstrapData parses what RenderBootstrapData renders.
func ParseBootstrapData(data []byte) (BootstrapData, error) {
	var d BootstrapData
	if err := yaml.UnmarshalStrict(data, &d); err != nil {
		return d, fmt.Errorf("parsing bootstrap data: %w", err)
	}
	return d, nil
}

// BootstrapSecret returns a bootstrap data Secret of the given cluster, the
// shape a bootstrap provider writes (type cluster.x-k8s.io/secret, label
// cluster-name, key "value"). Point a Machine or MachineDeployment at it with
// spec.bootstrap.dataSecretName.
func BootstrapSecret(namespace, name, clusterName string, d BootstrapData) (*corev1.Secret, error) {
	data, err := RenderBootstrapData(d)
	if err != nil {
		return nil, err
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace,
			Name:      name,
			Labels:    map[string]string{clusterv1.ClusterNameLabel: clusterName},
		},
		Type: clusterv1.ClusterSecretType,
		Data: map[string][]byte{"value": data, "format": []byte("world-yaml")},
	}, nil
}
