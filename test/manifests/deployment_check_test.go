package manifests

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/autonode/karpenter-clusterapi/test/environment"
)

// topology is where a rendering runs the provider.
type topology int

const (
	inWorkloadCluster topology = iota
	inManagementCluster
)

// deploymentExpectations say what a rendering of the provider must satisfy.
type deploymentExpectations struct {
	topology topology
	// metricsPort and healthPort are the ports core serves on.
	metricsPort, healthPort int32
}

// checkDeployment checks the provider's Deployment in a rendering against the
// binary's contract (README's Flags table, core's ports and probes) and the
// topology: every kubeconfig path points into a mounted volume with the
// right source, leader election stays on, a Service exposes the metrics and
// a PodDisruptionBudget covers the pods.
func checkDeployment(t *testing.T, objs []*unstructured.Unstructured, want deploymentExpectations) {
	t.Helper()
	deployments := find(objs, "Deployment")
	if len(deployments) != 1 {
		t.Fatalf("rendering holds %d Deployments, want 1", len(deployments))
	}
	d := &appsv1.Deployment{}
	convert(t, deployments[0], d)
	pod := d.Spec.Template
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("Deployment %s has %d containers, want 1", d.Name, len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	env := resolveEnv(t, objs, d, c)

	// Replicas with leader election.
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("Deployment %s: want at least 2 replicas (one leads, one stands by)", d.Name)
	}
	if env["DISABLE_LEADER_ELECTION"] == "true" {
		t.Errorf("Deployment %s disables leader election", d.Name)
	}
	checkHighAvailability(t, objs, d, env, want.topology)

	// Probes and ports as core serves them.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["http-metrics"] != want.metricsPort {
		t.Errorf("container port http-metrics = %d, want %d", ports["http-metrics"], want.metricsPort)
	}
	if ports["http"] != want.healthPort {
		t.Errorf("container port http = %d, want %d", ports["http"], want.healthPort)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "http" {
			t.Errorf("%s probe: want HTTP GET %s on port http, got %+v", p.name, p.path, p.probe)
		}
	}
	if v, ok := env["METRICS_PORT"]; ok && v != fmt.Sprint(want.metricsPort) {
		t.Errorf("METRICS_PORT = %s, want %d", v, want.metricsPort)
	}
	if v, ok := env["HEALTH_PROBE_PORT"]; ok && v != fmt.Sprint(want.healthPort) {
		t.Errorf("HEALTH_PROBE_PORT = %s, want %d", v, want.healthPort)
	}

	// The metrics Service and the PodDisruptionBudget select the pods.
	podLabels := labels.Set(pod.Labels)
	services := find(objs, "Service")
	if len(services) != 1 {
		t.Errorf("rendering holds %d Services, want 1 (metrics)", len(services))
	} else {
		svc := &corev1.Service{}
		convert(t, services[0], svc)
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) || len(svc.Spec.Selector) == 0 {
			t.Errorf("Service %s selector %v does not select the pods %v", svc.Name, svc.Spec.Selector, pod.Labels)
		}
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != want.metricsPort || svc.Spec.Ports[0].TargetPort.String() != "http-metrics" {
			t.Errorf("Service %s ports %+v, want %d -> http-metrics", svc.Name, svc.Spec.Ports, want.metricsPort)
		}
	}
	pdbs := find(objs, "PodDisruptionBudget")
	if len(pdbs) != 1 {
		t.Errorf("rendering holds %d PodDisruptionBudgets, want 1", len(pdbs))
	} else {
		pdb := &policyv1.PodDisruptionBudget{}
		convert(t, pdbs[0], pdb)
		s, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || !s.Matches(podLabels) {
			t.Errorf("PodDisruptionBudget %s does not select the pods: %v", pdb.Name, err)
		}
	}

	// The kubeconfigs: each path lies in a mounted volume with the right source.
	hubPath := env["CLUSTER_API_KUBECONFIG"]
	hub := mountedFile(t, pod.Spec, c, hubPath)
	var workloadPath string
	for _, a := range c.Args {
		if p, ok := strings.CutPrefix(a, "--kubeconfig="); ok {
			workloadPath = p
		}
	}
	if workloadPath == "" {
		workloadPath = env["KUBECONFIG"]
	}
	switch want.topology {
	case inWorkloadCluster:
		if hub.Secret == nil {
			t.Errorf("CLUSTER_API_KUBECONFIG %q: want a file from the hub kubeconfig Secret, got %+v", hubPath, hub)
		}
		if workloadPath != "" {
			t.Errorf("in the workload cluster the workload cluster is the in-cluster config, yet --kubeconfig is %q", workloadPath)
		}
		if env["INSTALL_WORKLOAD_CRDS"] == "true" && !grantsCRDWrites(t, objs) {
			t.Errorf("INSTALL_WORKLOAD_CRDS=true without RBAC to write CRDs")
		}
	case inManagementCluster:
		if hub.ConfigMap == nil {
			t.Errorf("CLUSTER_API_KUBECONFIG %q: want the in-cluster kubeconfig ConfigMap, got %+v", hubPath, hub)
		} else {
			checkInClusterKubeconfig(t, objs, hub.ConfigMap.Name, hub.key)
		}
		workload := mountedFile(t, pod.Spec, c, workloadPath)
		if workload.Secret == nil || workload.key != "value" {
			t.Errorf("--kubeconfig %q: want key value of Cluster API's <cluster>-kubeconfig Secret, got %+v", workloadPath, workload)
		} else if name := env["CLUSTER_API_CLUSTER_NAME"]; workload.Secret.SecretName != name+"-kubeconfig" {
			t.Errorf("--kubeconfig from Secret %q, want %q (CLUSTER_API_CLUSTER_NAME=%q)", workload.Secret.SecretName, name+"-kubeconfig", name)
		}
		if env["INSTALL_WORKLOAD_CRDS"] != "true" {
			t.Errorf("in the management cluster INSTALL_WORKLOAD_CRDS must be true (nobody else installs the CRDs in the workload cluster), got %q", env["INSTALL_WORKLOAD_CRDS"])
		}
		if env["LEADER_ELECTION_NAMESPACE"] == "" {
			t.Errorf("in the management cluster LEADER_ELECTION_NAMESPACE must name a namespace of the workload cluster (the Pod's own namespace need not exist there)")
		}
		if env["CLUSTER_API_NAMESPACE"] != d.Namespace {
			t.Errorf("CLUSTER_API_NAMESPACE = %q, want the Pod's namespace %q", env["CLUSTER_API_NAMESPACE"], d.Namespace)
		}
		for _, o := range objs {
			if o.GetNamespace() == "" && o.GetKind() != "CustomResourceDefinition" {
				t.Errorf("%s is cluster-scoped: in the management cluster the provider's credentials must stay in the Cluster's namespace", describe(o))
			}
		}
	}
	if env["CLUSTER_API_CLUSTER_NAME"] != "" && env["CLUSTER_API_NAMESPACE"] == "" {
		t.Errorf("CLUSTER_API_CLUSTER_NAME without CLUSTER_API_NAMESPACE: the binary refuses to start")
	}
}

// resolveEnv returns the container's environment as the kubelet would set
// it: envFrom ConfigMaps of the rendering first, then env, with
// metadata.namespace field references resolved.
func resolveEnv(t *testing.T, objs []*unstructured.Unstructured, d *appsv1.Deployment, c corev1.Container) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil {
			t.Errorf("envFrom %+v: only ConfigMaps of the rendering are expected", from)
			continue
		}
		cm := findConfigMap(t, objs, from.ConfigMapRef.Name)
		if cm == nil {
			t.Errorf("envFrom ConfigMap %q is not in the rendering", from.ConfigMapRef.Name)
			continue
		}
		for k, v := range cm.Data {
			env[k] = v
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			env[e.Name] = d.Namespace
		default:
			env[e.Name] = "<from " + e.ValueFrom.String() + ">"
		}
	}
	return env
}

func findConfigMap(t *testing.T, objs []*unstructured.Unstructured, name string) *corev1.ConfigMap {
	for _, o := range find(objs, "ConfigMap") {
		if o.GetName() == name {
			cm := &corev1.ConfigMap{}
			convert(t, o, cm)
			return cm
		}
	}
	return nil
}

// mounted is the source of a mounted file.
type mounted struct {
	Secret    *corev1.SecretVolumeSource
	ConfigMap *corev1.ConfigMapVolumeSource
	key       string
}

// mountedFile finds the volume a file path lies in and the key it shows.
func mountedFile(t *testing.T, spec corev1.PodSpec, c corev1.Container, file string) mounted {
	t.Helper()
	if file == "" {
		t.Errorf("a kubeconfig path is empty")
		return mounted{}
	}
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			var items []corev1.KeyToPath
			out := mounted{Secret: v.Secret, ConfigMap: v.ConfigMap, key: rel}
			switch {
			case v.Secret != nil:
				items = v.Secret.Items
			case v.ConfigMap != nil:
				items = v.ConfigMap.Items
			}
			for _, it := range items {
				if path.Clean(it.Path) == rel {
					out.key = it.Key
				}
			}
			return out
		}
		t.Errorf("volume mount %s names no volume", m.Name)
	}
	t.Errorf("kubeconfig %q is not in any mounted volume", file)
	return mounted{}
}

// checkInClusterKubeconfig checks the management cluster's kubeconfig made
// of the Pod's ServiceAccount files: no secret in it.
func checkInClusterKubeconfig(t *testing.T, objs []*unstructured.Unstructured, name, key string) {
	t.Helper()
	cm := findConfigMap(t, objs, name)
	if cm == nil {
		t.Errorf("ConfigMap %s with the in-cluster kubeconfig is not in the rendering", name)
		return
	}
	var kc struct {
		Users []struct {
			User map[string]any `json:"user"`
		} `json:"users"`
		Clusters []struct {
			Cluster map[string]any `json:"cluster"`
		} `json:"clusters"`
	}
	if _, err := clientcmd.Load([]byte(cm.Data[key])); err != nil {
		t.Errorf("ConfigMap %s key %s is not a kubeconfig: %v", name, key, err)
		return
	}
	if err := yaml.Unmarshal([]byte(cm.Data[key]), &kc); err != nil {
		t.Errorf("ConfigMap %s key %s is not a kubeconfig: %v", name, key, err)
		return
	}
	if len(kc.Users) != 1 || len(kc.Clusters) != 1 {
		t.Errorf("in-cluster kubeconfig: want one user and one cluster, got %d and %d", len(kc.Users), len(kc.Clusters))
		return
	}
	if kc.Users[0].User["tokenFile"] != "/var/run/secrets/kubernetes.io/serviceaccount/token" || len(kc.Users[0].User) != 1 {
		t.Errorf("in-cluster kubeconfig user %v: want only the ServiceAccount tokenFile", kc.Users[0].User)
	}
	if kc.Clusters[0].Cluster["certificate-authority"] != "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt" {
		t.Errorf("in-cluster kubeconfig cluster %v: want the ServiceAccount's CA", kc.Clusters[0].Cluster)
	}
}

func grantsCRDWrites(t *testing.T, objs []*unstructured.Unstructured) bool {
	for _, o := range find(objs, "ClusterRole") {
		role := &rbacv1.ClusterRole{}
		convert(t, o, role)
		for _, r := range role.Rules {
			if contains(r.APIGroups, "apiextensions.k8s.io") && contains(r.Resources, "customresourcedefinitions") && contains(r.Verbs, "patch") && contains(r.Verbs, "create") {
				return true
			}
		}
	}
	return false
}

// checkRules checks that the role of a kind whose name ends in suffix holds
// exactly the rules of a generated role file (config/rbac/...).
func checkRules(t *testing.T, objs []*unstructured.Unstructured, kind, suffix string, generated []rbacv1.PolicyRule) {
	t.Helper()
	var roles []*unstructured.Unstructured
	for _, o := range find(objs, kind) {
		if strings.HasSuffix(o.GetName(), suffix) {
			roles = append(roles, o)
		}
	}
	if len(roles) != 1 {
		t.Errorf("rendering holds %d %ss named *%s, want 1", len(roles), kind, suffix)
		return
	}
	var rules []rbacv1.PolicyRule
	raw, _, _ := unstructured.NestedSlice(roles[0].Object, "rules")
	for _, r := range raw {
		rule := rbacv1.PolicyRule{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(r.(map[string]any), &rule); err != nil {
			t.Fatal(err)
		}
		rules = append(rules, rule)
	}
	if !equality.Semantic.DeepEqual(rules, generated) {
		t.Errorf("%s %s rules differ from the generated ones:\n got %+v\nwant %+v", kind, roles[0].GetName(), rules, generated)
	}
}

// generatedRules reads the rules of a role file of the repository.
func generatedRules(t *testing.T, rel string) []rbacv1.PolicyRule {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(environment.RepoRoot(), rel))
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.Unmarshal(data, role); err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	return role.Rules
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s || x == "*" {
			return true
		}
	}
	return false
}

func convert(t *testing.T, u *unstructured.Unstructured, out any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		t.Fatalf("%s: %v", describe(u), err)
	}
}
