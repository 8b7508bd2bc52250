package autonode

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

var testConfig = Config{Image: "ghcr.io/autonode/karpenter-clusterapi:v1.2.3", Version: "v1.2.3", HubClusterRole: DefaultHubClusterRole}

func desiredDeployment(t *testing.T, annotations map[string]string) *appsv1.Deployment {
	t.Helper()
	c := cluster(map[string]string{EnabledLabel: Enabled}, annotations)
	s, errs := Parse(c)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	for _, o := range Desired(c, s, testConfig) {
		if d, ok := o.(*appsv1.Deployment); ok {
			return d
		}
	}
	t.Fatal("no Deployment")
	return nil
}

// Every object is named after the Cluster, in its namespace, owned by it
// (garbage-collected with it) and labelled as AutoNode's.
func TestDesiredObjectsOwnedByTheCluster(t *testing.T) {
	c := cluster(map[string]string{EnabledLabel: Enabled}, nil)
	s, _ := Parse(c)
	objs := Desired(c, s, testConfig)
	if len(objs) != 4 {
		t.Fatalf("%d objects", len(objs))
	}
	for _, o := range objs {
		if o.GetNamespace() != "team-a" || o.GetName() != "prod-karpenter" {
			t.Errorf("%T %s/%s", o, o.GetNamespace(), o.GetName())
		}
		refs := o.GetOwnerReferences()
		if len(refs) != 1 || refs[0].Kind != "Cluster" || refs[0].UID != "uid-1" || refs[0].Name != "prod" {
			t.Errorf("%T owner references %v", o, refs)
		}
		if o.GetLabels()[ManagedByLabel] != ManagedBy {
			t.Errorf("%T labels %v", o, o.GetLabels())
		}
	}
}

// The RoleBinding binds the hub ClusterRole in the Cluster's namespace to
// the Cluster's ServiceAccount only.
func TestDesiredRoleBindingIsNamespaced(t *testing.T) {
	c := cluster(nil, nil)
	s, _ := Parse(c)
	rb := Desired(c, s, testConfig)[1].(*rbacv1.RoleBinding)
	if rb.Namespace != "team-a" || rb.RoleRef.Kind != "ClusterRole" || rb.RoleRef.Name != DefaultHubClusterRole {
		t.Errorf("role binding %+v", rb)
	}
	if len(rb.Subjects) != 1 || rb.Subjects[0].Kind != "ServiceAccount" || rb.Subjects[0].Namespace != "team-a" || rb.Subjects[0].Name != "prod-karpenter" {
		t.Errorf("subjects %+v", rb.Subjects)
	}
}

// Topology (b): hub in-cluster, spoke from the provider's own workload
// identity (never Cluster API's admin kubeconfig), scope flags, the Lease in
// the workload cluster. AutoNode installs the CRDs: the provider does not.
func TestDesiredDeploymentIsTopologyB(t *testing.T) {
	d := desiredDeployment(t, nil)
	ctr := d.Spec.Template.Spec.Containers[0]
	for _, want := range []string{
		"--kubeconfig=" + SpokeKubeconfigDir + "/kubeconfig", "--cluster-api-kubeconfig=" + HubKubeconfigDir + "/kubeconfig",
		"--cluster-api-namespace=team-a", "--cluster-api-cluster-name=prod",
	} {
		if !slices.Contains(ctr.Args, want) {
			t.Errorf("args %v lack %s", ctr.Args, want)
		}
	}
	if slices.Contains(ctr.Args, "--approve-kubelet-csrs=true") {
		t.Error("CSR approval without the setting")
	}
	if slices.ContainsFunc(ctr.Args, func(a string) bool { return strings.HasPrefix(a, "--install-workload-crds") }) {
		t.Errorf("args %v: the provider's identity may not write CRDs", ctr.Args)
	}
	if ctr.Image != testConfig.Image || d.Annotations[VersionAnnotation] != "v1.2.3" || *d.Spec.Replicas != 1 {
		t.Errorf("image %s, version %s, replicas %d", ctr.Image, d.Annotations[VersionAnnotation], *d.Spec.Replicas)
	}
	if envOf(ctr, "LEADER_ELECTION_NAMESPACE") != "kube-system" || envOf(ctr, "DISABLE_LEADER_ELECTION") != "" {
		t.Errorf("leader election env %v", ctr.Env)
	}
	var secret *corev1.SecretVolumeSource
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			secret = v.Secret
		}
	}
	if secret == nil || secret.SecretName != "prod-karpenter-workload" || len(secret.Items) != 2 || secret.Items[0].Key != "kubeconfig" || secret.Items[1].Key != "token" {
		t.Errorf("workload kubeconfig volume %+v", secret)
	}
	if d.Spec.Template.Spec.ServiceAccountName != "prod-karpenter" {
		t.Errorf("service account %s", d.Spec.Template.Spec.ServiceAccountName)
	}
}

// The settings reach the Deployment; the image follows the controller's
// version unless overridden.
func TestDesiredDeploymentFollowsSettings(t *testing.T) {
	d := desiredDeployment(t, map[string]string{
		ApproveKubeletCSRsAnnotation: "true", ReplicasAnnotation: "3", ResourcesAnnotation: "cpu=2,memory=3Gi",
		LogLevelAnnotation: "debug", ImageAnnotation: "mirror.example/kc:pinned",
	})
	ctr := d.Spec.Template.Spec.Containers[0]
	cpu, mem, limit := ctr.Resources.Requests[corev1.ResourceCPU], ctr.Resources.Requests[corev1.ResourceMemory], ctr.Resources.Limits[corev1.ResourceMemory]
	if !slices.Contains(ctr.Args, "--approve-kubelet-csrs=true") || *d.Spec.Replicas != 3 || cpu.String() != "2" || mem.String() != "3Gi" ||
		limit.String() != "3Gi" || envOf(ctr, "LOG_LEVEL") != "debug" || ctr.Image != "mirror.example/kc:pinned" {
		t.Errorf("deployment does not follow the settings: args %v replicas %d resources %v env %v image %s", ctr.Args, *d.Spec.Replicas, ctr.Resources, ctr.Env, ctr.Image)
	}
}

func TestHubKubeconfigIsInCluster(t *testing.T) {
	c := cluster(nil, nil)
	s, _ := Parse(c)
	cm := Desired(c, s, testConfig)[2].(*corev1.ConfigMap)
	k := cm.Data["kubeconfig"]
	for _, want := range []string{"server: " + InClusterServer, "tokenFile: " + ServiceAccountDir + "/token", "namespace: team-a"} {
		if !strings.Contains(k, want) {
			t.Errorf("hub kubeconfig lacks %q:\n%s", want, k)
		}
	}
}

func envOf(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}
