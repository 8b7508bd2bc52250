package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// Topology (b), the HyperShift AutoNode pattern: the provider runs in the
// management cluster, in the Cluster's namespace. Its workload-cluster
// credential is Cluster API's own "<cluster>-kubeconfig" Secret, its hub
// credential can touch that namespace only, and nobody installed the
// Karpenter CRDs in the workload cluster: --install-workload-crds does.
// A world of its own, because the shared one has the CRDs installed.
func TestTopologyProviderInManagementClusterInstallsWorkloadCRDs(t *testing.T) {
	ctx := context.Background()
	const ns, cluster = "team-a", "c2"
	tw, err := world.Start(ctx, world.Options{Namespace: ns, ClusterName: cluster, WithoutWorkloadCRDs: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		tw.KeepDir = t.Failed() || os.Getenv("E2E_KEEP_LOGS") != ""
		if tw.KeepDir {
			t.Logf("logs: %v", tw.LogFiles())
		}
		_ = tw.Stop()
	})
	workloadCRDs := []string{"nodepools.karpenter.sh", "nodeclaims.karpenter.sh", "nodeoverlays.karpenter.sh", "clusterapinodeclasses.karpenter.cluster.x-k8s.io"}
	for _, name := range workloadCRDs {
		if err := tw.Spoke.Client.Get(ctx, client.ObjectKey{Name: name}, &apiextensionsv1.CustomResourceDefinition{}); !apierrors.IsNotFound(err) {
			t.Fatalf("the workload cluster must start without CRD %s, got %v", name, err)
		}
	}

	// The workload cluster's credential, as Cluster API keeps it.
	secret := &corev1.Secret{}
	if err := tw.Hub.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: cluster + "-kubeconfig"}, secret); err != nil {
		t.Fatal(err)
	}
	workloadKubeconfig := filepath.Join(tw.Dir, "from-secret.kubeconfig")
	if err := os.WriteFile(workloadKubeconfig, secret.Data["value"], 0o600); err != nil {
		t.Fatal(err)
	}
	hubKubeconfig := namespacedHubUser(t, tw)

	logPath := "topology-provider.log"
	// Later flags win: these replace StartProvider's world kubeconfigs.
	p, err := StartProvider(bin, tw, logPath,
		"--kubeconfig="+workloadKubeconfig,
		"--cluster-api-kubeconfig="+hubKubeconfig,
		"--install-workload-crds",
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	t.Cleanup(func() {
		if t.Failed() {
			dumpTail(p.LogPath, 100)
		}
	})

	start := time.Now()
	err = WaitFor(ctx, 2*time.Minute, func(ctx context.Context) (bool, error) {
		if p.Exited() {
			t.Fatalf("the provider exited (log %s)", p.LogPath)
		}
		for _, name := range workloadCRDs {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := tw.Spoke.Client.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
				return false, err
			}
			if !established(crd) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the provider did not install the workload CRDs: %v", err)
	}
	t.Logf("workload CRDs established %s after the provider started", time.Since(start).Round(time.Millisecond))

	// A NodeClass, a NodePool, a member MachineDeployment, one pending pod.
	nc := &v1alpha1.ClusterAPINodeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "topology"},
		Spec:       v1alpha1.ClusterAPINodeClassSpec{ScalableResourceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "topology"}}},
	}
	np := &karpv1.NodePool{
		ObjectMeta: metav1.ObjectMeta{Name: "topology"},
		Spec: karpv1.NodePoolSpec{Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{
			NodeClassRef: &karpv1.NodeClassReference{Group: v1alpha1.Group, Kind: "ClusterAPINodeClass", Name: "topology"},
			Requirements: []karpv1.NodeSelectorRequirementWithMinValues{
				{Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: []string{karpv1.CapacityTypeOnDemand}},
			},
		}}},
	}
	for _, o := range []client.Object{nc, np} {
		if err := tw.Spoke.Client.Create(ctx, o); err != nil {
			t.Fatalf("creating %T: %v", o, err)
		}
	}
	if _, err := tw.CreateAWSMachineTemplate(ctx, "topology-m5-large", "m5.large", false); err != nil {
		t.Fatal(err)
	}
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: ns, Name: "topology-m5-large", ClusterName: cluster, Member: true,
		Labels: map[string]string{"pool": "topology"}, FailureDomain: "us-east-1b",
		Annotations: map[string]string{v1alpha1.PriceAnnotation: "0.096"},
	})
	if err := tw.Hub.Client.Create(ctx, md); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "topology"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "topology"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: new(int64),
					Containers: []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10",
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}},
				},
			},
		},
	}
	if err := tw.Spoke.Client.Create(ctx, d); err != nil {
		t.Fatal(err)
	}

	start = time.Now()
	var node string
	err = WaitFor(ctx, 3*time.Minute, func(ctx context.Context) (bool, error) {
		pods := &corev1.PodList{}
		if err := tw.Spoke.Client.List(ctx, pods, client.InNamespace("default"), client.MatchingLabels(labels)); err != nil {
			return false, err
		}
		for _, pod := range pods.Items {
			if pod.Status.Phase == corev1.PodRunning && pod.Spec.NodeName != "" {
				node = pod.Spec.NodeName
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the pending pod got no node: %v", err)
	}
	n := &corev1.Node{}
	if err := tw.Spoke.Client.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
		t.Fatal(err)
	}
	if n.Labels[karpv1.NodePoolLabelKey] != "topology" {
		t.Fatalf("the pod runs on %s, not on a node of NodePool topology: labels %v", node, n.Labels)
	}
	machines := &clusterv1.MachineList{}
	if err := tw.Hub.Client.List(ctx, machines, client.InNamespace(ns), client.HasLabels{v1alpha1.KarpenterMemberLabel}); err != nil {
		t.Fatal(err)
	}
	// Exactly one live Machine is bound, and it is the pod's node's. Others
	// may be there for a moment: a MachineSet under load can make one
	// Machine more than its replicas and remove it on its next reconcile.
	var boundMachines []clusterv1.Machine
	var seen []string
	for _, m := range machines.Items {
		seen = append(seen, fmt.Sprintf("%s (NodeClaim %q, node %q, deleting %v)", m.Name, m.Annotations[v1alpha1.NodeClaimAnnotation],
			m.Status.NodeRef.Name, !m.DeletionTimestamp.IsZero()))
		if m.DeletionTimestamp.IsZero() && m.Annotations[v1alpha1.NodeClaimAnnotation] != "" {
			boundMachines = append(boundMachines, m)
		}
	}
	if len(boundMachines) != 1 || boundMachines[0].Status.NodeRef.Name != node {
		t.Fatalf("want exactly 1 live Machine in %s bound to a NodeClaim, with node %s; Machines: %v", ns, node, seen)
	}
	t.Logf("pod running on %s (Machine %s/%s) %s after the Deployment was created",
		node, ns, boundMachines[0].Name, time.Since(start).Round(time.Millisecond))
}

// namespacedHubUser adds a hub user that holds the rules of
// config/rbac/hub/role.yaml in the world's namespace only, checks that it can
// read nothing elsewhere, and returns its kubeconfig.
func namespacedHubUser(t *testing.T, tw *world.World) string {
	t.Helper()
	ctx := context.Background()
	raw, err := os.ReadFile(filepath.Join(environment.RepoRoot(), "config", "rbac", "hub", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	clusterRole := &rbacv1.ClusterRole{}
	if err := yaml.Unmarshal(raw, clusterRole); err != nil {
		t.Fatal(err)
	}
	const user = "karpenter-clusterapi"
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: tw.Namespace, Name: user}, Rules: clusterRole.Rules}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: tw.Namespace, Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := tw.Hub.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	u, err := tw.Hub.Env.ControlPlane.AddUser(envtest.User{Name: user}, nil)
	if err != nil {
		t.Fatal(err)
	}
	limited, err := client.New(u.Config(), client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := limited.List(ctx, &clusterv1.MachineList{}, client.InNamespace("kube-system")); !apierrors.IsForbidden(err) {
		t.Fatalf("the hub user must not read Machines outside %s, got %v", tw.Namespace, err)
	}
	kubeconfig, err := u.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(tw.Dir, "hub-namespaced.kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}
