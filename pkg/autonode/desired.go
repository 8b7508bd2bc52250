package autonode

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Labels of every object AutoNode creates.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedBy      = "karpenter-clusterapi-autonode"
	nameLabel      = "app.kubernetes.io/name"
	providerName   = "karpenter-clusterapi"
	instanceLabel  = "app.kubernetes.io/instance"
	// VersionAnnotation on the Deployment: the controller version that wrote it.
	VersionAnnotation = annotationPrefix + "controller-version"
)

// nameSuffix names every object of a Cluster: "<cluster>-karpenter".
const nameSuffix = "-karpenter"

// Paths inside the provider's container.
const (
	// Binary is the provider's path in the image (Dockerfile).
	Binary             = "/karpenter-clusterapi"
	HubKubeconfigDir   = "/etc/karpenter-clusterapi/hub"
	SpokeKubeconfigDir = "/etc/karpenter-clusterapi/workload"
	// ServiceAccountDir is where the kubelet mounts the Pod's ServiceAccount
	// token and the cluster's CA.
	ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	// InClusterServer is the management cluster's API server as its Pods
	// reach it.
	InClusterServer = "https://kubernetes.default.svc"
)

// Config is the controller's side of the desired objects.
type Config struct {
	// Image is the provider's image of the controller's version.
	Image string
	// Version is the controller's version (VersionAnnotation).
	Version string
	// HubClusterRole holds the provider's rules in the management cluster
	// (config/rbac/hub): each Cluster's ServiceAccount gets it in the
	// Cluster's namespace only, through a RoleBinding.
	HubClusterRole string
}

// ObjectName is the name of a Cluster's AutoNode objects.
func ObjectName(c *clusterv1.Cluster) string { return c.Name + nameSuffix }

// KubeconfigSecretName is Cluster API's Secret of the workload cluster's
// admin kubeconfig (key "value").
func KubeconfigSecretName(c *clusterv1.Cluster) string { return c.Name + "-kubeconfig" }

// Labels are the labels of a Cluster's AutoNode objects and their selector.
func Labels(c *clusterv1.Cluster) map[string]string {
	return map[string]string{
		nameLabel:                  providerName,
		instanceLabel:              c.Name,
		ManagedByLabel:             ManagedBy,
		clusterv1.ClusterNameLabel: c.Name,
	}
}

// Desired is what runs Karpenter for the Cluster: its ServiceAccount, the
// RoleBinding of the hub rules in its namespace, the management cluster's
// in-cluster kubeconfig and the provider's Deployment, all owned by the
// Cluster (garbage-collected with it).
func Desired(c *clusterv1.Cluster, s Settings, cfg Config) []client.Object {
	return []client.Object{
		serviceAccount(c),
		roleBinding(c, cfg),
		hubKubeconfig(c),
		deployment(c, s, cfg),
	}
}

func objectMeta(c *clusterv1.Cluster) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Namespace: c.Namespace, Name: ObjectName(c), Labels: Labels(c),
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: c.Name, UID: c.UID,
			// No blockOwnerDeletion: deleting the Cluster never waits on these.
			Controller: ptr.To(true),
		}},
	}
}

func serviceAccount(c *clusterv1.Cluster) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"}, ObjectMeta: objectMeta(c)}
}

// roleBinding grants the hub rules in the Cluster's namespace only. A
// RoleBinding to the ClusterRole rather than a Role copy: the controller
// then needs only "bind" on that ClusterRole, never the rules themselves.
func roleBinding(c *clusterv1.Cluster, cfg Config) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "RoleBinding"},
		ObjectMeta: objectMeta(c),
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: cfg.HubClusterRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: c.Namespace, Name: ObjectName(c)}},
	}
}

// hubKubeconfig is a kubeconfig of the Pod's own ServiceAccount (the files
// the kubelet mounts): no secret in it, and the token rotates.
func hubKubeconfig(c *clusterv1.Cluster) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: objectMeta(c),
		Data: map[string]string{"kubeconfig": fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: management
  cluster:
    server: %[1]s
    certificate-authority: %[2]s/ca.crt
users:
- name: karpenter-clusterapi
  user:
    tokenFile: %[2]s/token
contexts:
- name: management
  context:
    cluster: management
    user: karpenter-clusterapi
    namespace: %[3]s
current-context: management
`, InClusterServer, ServiceAccountDir, c.Namespace)},
	}
}

func image(s Settings, cfg Config) string {
	if s.Image != "" {
		return s.Image
	}
	return cfg.Image
}

func deployment(c *clusterv1.Cluster, s Settings, cfg Config) *appsv1.Deployment {
	m := objectMeta(c)
	m.Annotations = map[string]string{VersionAnnotation: cfg.Version}
	selector := map[string]string{instanceLabel: c.Name, ManagedByLabel: ManagedBy}
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: "Deployment"},
		ObjectMeta: m,
		Spec: appsv1.DeploymentSpec{
			Replicas:             ptr.To(s.Replicas),
			RevisionHistoryLimit: ptr.To[int32](3),
			Selector:             &metav1.LabelSelector{MatchLabels: selector},
			Strategy: appsv1.DeploymentStrategy{
				Type:          appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: ptr.To(intstr.FromInt32(1))},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: Labels(c)},
				Spec:       podSpec(c, s, cfg),
			},
		},
	}
}

func podSpec(c *clusterv1.Cluster, s Settings, cfg Config) corev1.PodSpec {
	return corev1.PodSpec{
		ServiceAccountName:           ObjectName(c),
		AutomountServiceAccountToken: ptr.To(true),
		SecurityContext: &corev1.PodSecurityContext{
			RunAsNonRoot:   ptr.To(true),
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		Containers: []corev1.Container{container(c, s, cfg)},
		Volumes: []corev1.Volume{
			{Name: "hub-kubeconfig", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: ObjectName(c)},
			}}},
			// The provider's own workload identity (kubeconfig and token),
			// never Cluster API's admin kubeconfig.
			{Name: "workload-kubeconfig", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: TokenSecretName(c),
				Items:      []corev1.KeyToPath{{Key: "kubeconfig", Path: "kubeconfig"}, {Key: "token", Path: "token"}},
			}}},
		},
		// Several replicas: never two on one node.
		Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
				Weight: 100,
				PodAffinityTerm: corev1.PodAffinityTerm{
					TopologyKey:   corev1.LabelHostname,
					LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{instanceLabel: c.Name, ManagedByLabel: ManagedBy}},
				},
			}},
		}},
	}
}

func container(c *clusterv1.Cluster, s Settings, cfg Config) corev1.Container {
	args := []string{
		"--kubeconfig=" + SpokeKubeconfigDir + "/kubeconfig",
		"--cluster-api-kubeconfig=" + HubKubeconfigDir + "/kubeconfig",
		"--cluster-api-namespace=" + c.Namespace,
		"--cluster-api-cluster-name=" + c.Name,
	}
	if s.ApproveKubeletCSRs {
		args = append(args, "--approve-kubelet-csrs=true")
	}
	memory := s.Requests[corev1.ResourceMemory]
	return corev1.Container{
		Name:    "controller",
		Image:   image(s, cfg),
		Command: []string{Binary},
		Args:    args,
		Env: []corev1.EnvVar{
			// The Lease lives in the workload cluster, where the management
			// cluster's namespace need not exist.
			{Name: "LEADER_ELECTION_NAMESPACE", Value: "kube-system"},
			{Name: "LOG_LEVEL", Value: s.LogLevel},
			{Name: "MEMORY_LIMIT", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{
				ContainerName: "controller", Resource: "limits.memory",
			}}},
			{Name: "CPU_REQUESTS", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{
				ContainerName: "controller", Resource: "requests.cpu", Divisor: resource.MustParse("1m"),
			}}},
		},
		Ports: []corev1.ContainerPort{
			{Name: "http-metrics", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
			{Name: "http", ContainerPort: 8081, Protocol: corev1.ProtocolTCP},
		},
		LivenessProbe: &corev1.Probe{
			ProbeHandler:        corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}},
			InitialDelaySeconds: 30, TimeoutSeconds: 30,
		},
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:        corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("http")}},
			InitialDelaySeconds: 5, TimeoutSeconds: 30,
		},
		Resources: corev1.ResourceRequirements{
			Requests: s.Requests,
			Limits:   corev1.ResourceList{corev1.ResourceMemory: memory},
		},
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			RunAsNonRoot:             ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "hub-kubeconfig", MountPath: HubKubeconfigDir, ReadOnly: true},
			{Name: "workload-kubeconfig", MountPath: SpokeKubeconfigDir, ReadOnly: true},
		},
	}
}
