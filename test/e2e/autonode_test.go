package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/autonode"
	"github.com/autonode/karpenter-clusterapi/test/autonoderun"
	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/podrun"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// The image AutoNode deploys in this test; the pod runner maps it to the
// binary under test.
const (
	autonodeImage     = "karpenter-clusterapi:e2e"
	autonodeNamespace = "karpenter-autonode"
)

// AutoNode (issue 48): two Clusters in namespaces of their own opt in with
// the label; the AutoNode controller (the binary's subcommand, under its
// generated least-privilege RBAC) deploys a provider for each, and each
// Deployment is run as a kubelet would run it (test/podrun: its command,
// args and env, its ConfigMap and Secret volumes as files, its
// ServiceAccount's token from TokenRequest), so the hub rights exercised
// are the RoleBinding AutoNode created. Both Clusters' NodeClasses select
// the same pool label: each workload cluster's pods must get nodes from its
// own Cluster's MachineDeployment only. Then b1 opts out: its NodePools go,
// Karpenter removes its nodes, and only then its provider; a1 is untouched.
// The suite's Cluster c1, which already has a (hand-run) provider, gets a
// malformed setting (reported, nothing created), then a valid one while a
// provider Deployment exists in its workload cluster (refused).
func TestAutoNode(t *testing.T) {
	ctx := context.Background()
	start := time.Now()
	a1, b1 := addAutoNodeClusters(t)
	t.Logf("Clusters autonode-a/a1 and autonode-b/b1 with their workload clusters added in %s", time.Since(start).Round(100*time.Millisecond))

	runner := startPodRunner(t)
	controller, metricsPort := startAutoNodeController(t, "e2e")
	t.Cleanup(func() {
		if t.Failed() {
			dumpTail(controller.LogPath, 80)
			for _, c := range []*world.WorkloadCluster{a1, b1} {
				for _, p := range runner.Processes(client.ObjectKey{Namespace: c.Namespace, Name: c.Name + "-karpenter"}) {
					dumpTail(p.LogPath, 60)
				}
			}
		}
	})

	const pool, selected = "autonode", "autonode"
	mdA := namespacedMachineDeployment(t, a1, selected, "a1-m5", "m5.large", "us-east-1a")
	mdB := namespacedMachineDeployment(t, b1, selected, "b1-m5", "m5.large", "us-east-1b")
	poolIn(t, a1.Spoke.Client, pool, selected)
	poolIn(t, b1.Spoke.Client, pool, selected)

	optIn := time.Now()
	// a1 asks for kubelet CSR approval, b1 does not.
	setClusterMetadata(t, a1, map[string]string{autonode.EnabledLabel: autonode.Enabled}, map[string]string{autonode.ApproveKubeletCSRsAnnotation: "true"})
	setClusterMetadata(t, b1, map[string]string{autonode.EnabledLabel: autonode.Enabled}, nil)
	for _, c := range []*world.WorkloadCluster{a1, b1} {
		waitAutoNodeCondition(t, c, metav1.ConditionTrue, autonode.ReasonRunning, "(AutoNode e2e)")
	}
	t.Logf("both providers Running %s after the label", time.Since(optIn).Round(100*time.Millisecond))
	checkReadyMetric(t, metricsPort, a1, 1)
	checkOwnedByCluster(t, a1)
	checkProviderRBAC(t, a1, b1)
	checkWorkloadIdentity(t, a1, true)
	checkWorkloadIdentity(t, b1, false)

	scale := time.Now()
	deploymentIn(t, a1.Spoke.Client, pool, "autonode-app", 2, "1500m")
	deploymentIn(t, b1.Spoke.Client, pool, "autonode-app", 2, "1500m")
	waitOwnNodes(t, a1, pool, mdA, 2)
	waitOwnNodes(t, b1, pool, mdB, 2)
	t.Logf("2 pods running in each workload cluster on its own Cluster's nodes %s after the Deployments", time.Since(scale).Round(100*time.Millisecond))

	checkMalformedAndHandInstalled(t)

	// b1 opts out; a1's provider must not change.
	before := &appsv1.Deployment{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: a1.Namespace, Name: "a1-karpenter"}, before); err != nil {
		t.Fatal(err)
	}
	optOut := time.Now()
	setClusterMetadata(t, b1, map[string]string{autonode.EnabledLabel: autonode.Disabled}, nil)
	waitOptedOut(t, b1, mdB)
	t.Logf("b1 opted out: NodePools deleted, its nodes and Machines gone, then its provider, %s after the label", time.Since(optOut).Round(100*time.Millisecond))
	after := &appsv1.Deployment{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(before), after); err != nil {
		t.Fatal(err)
	}
	if after.UID != before.UID || after.Generation != before.Generation {
		t.Errorf("a1's provider Deployment changed while b1 opted out: uid %s→%s, generation %d→%d", before.UID, after.UID, before.Generation, after.Generation)
	}
	waitOwnNodes(t, a1, pool, mdA, 2)
	waitAutoNodeCondition(t, a1, metav1.ConditionTrue, autonode.ReasonRunning, "")

	// a1 stops asking for CSR approval: its approver's rules are revoked.
	setClusterMetadata(t, a1, nil, map[string]string{autonode.ApproveKubeletCSRsAnnotation: "false"})
	err := WaitFor(ctx, time.Minute, func(ctx context.Context) (bool, error) {
		err := a1.Spoke.Client.Get(ctx, client.ObjectKey{Name: "karpenter-clusterapi-csr-approver"}, &rbacv1.ClusterRoleBinding{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatalf("a1's CSR approver binding stays after approve-kubelet-csrs=false: %v", err)
	}
	checkWorkloadIdentity(t, a1, false)
	t.Logf("TestAutoNode: %s in all", time.Since(start).Round(100*time.Millisecond))
}

// addAutoNodeClusters adds a1 and b1, each in a namespace of its own, in parallel.
func addAutoNodeClusters(t *testing.T) (*world.WorkloadCluster, *world.WorkloadCluster) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	clusters := make([]*world.WorkloadCluster, 2)
	errs := make([]error, 2)
	for i, c := range [][2]string{{"autonode-a", "a1"}, {"autonode-b", "b1"}} {
		if existing := w.Cluster(c[1]); existing != nil {
			clusters[i] = existing
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			clusters[i], errs[i] = w.AddClusterIn(ctx, c[0], c[1])
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return clusters[0], clusters[1]
}

// startPodRunner runs AutoNode's Deployments as a kubelet would.
func startPodRunner(t *testing.T) *podrun.Runner {
	t.Helper()
	r, err := autonoderun.StartPods(w.Hub.Config, bin, filepath.Join(w.Dir, "autonode-pods"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

// startAutoNodeController runs `karpenter-clusterapi autonode` with the
// identity its packaged RBAC gives it: a ServiceAccount holding
// config/rbac/autonode's rules (and the hub ClusterRole it binds).
func startAutoNodeController(t *testing.T, version string) (*autonoderun.Controller, int) {
	t.Helper()
	kubeconfig, err := autonoderun.Install(context.Background(), w.Hub.Client, w.Hub.Config, w.Dir)
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	c, err := autonoderun.StartController(bin, kubeconfig, version, fmt.Sprintf("127.0.0.1:%d", metrics), filepath.Join(w.Dir, "autonode-controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c, metrics
}

// namespacedMachineDeployment is an eligible MachineDeployment of a
// Cluster in the Cluster's namespace, from an AWSMachineTemplate there.
func namespacedMachineDeployment(t *testing.T, c *world.WorkloadCluster, pool, name, instanceType, zone string) *clusterv1.MachineDeployment {
	t.Helper()
	ctx := context.Background()
	tmpl := world.AWSMachineTemplate(c.Namespace, name, instanceType, false)
	status := tmpl.Status
	if err := w.Hub.Client.Create(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	tmpl.Status = status
	if err := w.Hub.Client.Status().Update(ctx, tmpl); err != nil {
		t.Fatal(err)
	}
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: c.Namespace, Name: name, ClusterName: c.Name, Member: true,
		Labels: map[string]string{"pool": pool}, Annotations: map[string]string{v1alpha1.PriceAnnotation: "0.096"}, FailureDomain: zone,
		BootstrapSecret: c.BootstrapSecretName,
	})
	if err := w.Hub.Client.Create(ctx, md); err != nil {
		t.Fatalf("creating MachineDeployment %s/%s: %v", c.Namespace, name, err)
	}
	return md
}

// setClusterMetadata sets (value) or removes ("") labels and annotations.
func setClusterMetadata(t *testing.T, c *world.WorkloadCluster, labels, annotations map[string]string) {
	t.Helper()
	ctx := context.Background()
	cl := &clusterv1.Cluster{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Name}, cl); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cl.DeepCopy())
	set := func(m map[string]string, changes map[string]string) map[string]string {
		if m == nil {
			m = map[string]string{}
		}
		for k, v := range changes {
			if v == "" {
				delete(m, k)
			} else {
				m[k] = v
			}
		}
		return m
	}
	cl.Labels = set(cl.Labels, labels)
	cl.Annotations = set(cl.Annotations, annotations)
	if err := w.Hub.Client.Patch(ctx, cl, patch); err != nil {
		t.Fatal(err)
	}
}

// waitAutoNodeCondition waits for AutoNode's condition on the Cluster with
// the status and reason, and a message containing want.
func waitAutoNodeCondition(t *testing.T, c *world.WorkloadCluster, status metav1.ConditionStatus, reason, want string) metav1.Condition {
	t.Helper()
	var last metav1.Condition
	err := WaitFor(context.Background(), 2*time.Minute, func(ctx context.Context) (bool, error) {
		cl := &clusterv1.Cluster{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Name}, cl); err != nil {
			return false, err
		}
		for _, cond := range cl.Status.Conditions {
			if cond.Type == autonode.ConditionType {
				last = cond
				return cond.Status == status && cond.Reason == reason && strings.Contains(cond.Message, want), nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("Cluster %s/%s: waiting for %s=%s (%s, %q): %v; last %+v", c.Namespace, c.Name, autonode.ConditionType, status, reason, want, err, last)
	}
	return last
}

// checkOwnedByCluster: every object AutoNode made for the Cluster is owned
// by it, so deleting the Cluster deletes them without waiting on anything.
func checkOwnedByCluster(t *testing.T, c *world.WorkloadCluster) {
	t.Helper()
	ctx := context.Background()
	cl := &clusterv1.Cluster{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Name}, cl); err != nil {
		t.Fatal(err)
	}
	if len(cl.Finalizers) > 0 {
		for _, f := range cl.Finalizers {
			if strings.Contains(f, "karpenter") || strings.Contains(f, "autonode") {
				t.Errorf("Cluster %s carries finalizer %s: deleting it would wait on Karpenter", c.Name, f)
			}
		}
	}
	key := client.ObjectKey{Namespace: c.Namespace, Name: c.Name + "-karpenter"}
	for _, o := range []client.Object{&appsv1.Deployment{}, &corev1.ServiceAccount{}, &rbacv1.RoleBinding{}, &corev1.ConfigMap{}, &corev1.Secret{}} {
		key := key
		if _, ok := o.(*corev1.Secret); ok {
			key.Name += "-workload" // the provider's workload token
		}
		if err := w.Hub.Client.Get(ctx, key, o); err != nil {
			t.Fatalf("%T %s: %v", o, key, err)
		}
		owned := false
		for _, ref := range o.GetOwnerReferences() {
			owned = owned || (ref.Kind == "Cluster" && ref.UID == cl.UID)
		}
		if !owned {
			t.Errorf("%T %s is not owned by Cluster %s: %v", o, key, c.Name, o.GetOwnerReferences())
		}
	}
}

// checkProviderRBAC asks the hub's API server (SubjectAccessReviews) what
// a1's provider identity may do: its Cluster's namespace, nothing else.
func checkProviderRBAC(t *testing.T, own, other *world.WorkloadCluster) {
	t.Helper()
	user := fmt.Sprintf("system:serviceaccount:%s:%s-karpenter", own.Namespace, own.Name)
	cases := []struct {
		namespace, verb, group, resource string
		allowed                          bool
	}{
		{own.Namespace, "patch", clusterv1.GroupVersion.Group, "machinedeployments", true},
		{own.Namespace, "create", clusterv1.GroupVersion.Group, "machines", true},
		{own.Namespace, "list", clusterv1.GroupVersion.Group, "clusters", true},
		{other.Namespace, "patch", clusterv1.GroupVersion.Group, "machinedeployments", false},
		{other.Namespace, "list", clusterv1.GroupVersion.Group, "machines", false},
		{other.Namespace, "get", "", "secrets", false},
		{world.DefaultNamespace, "create", clusterv1.GroupVersion.Group, "machines", false},
		{"", "list", clusterv1.GroupVersion.Group, "machines", false},
		{own.Namespace, "get", "", "secrets", false},
	}
	for _, c := range cases {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + own.Namespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: c.namespace, Verb: c.verb, Group: c.group, Resource: c.resource,
			},
		}}
		if err := w.Hub.Client.Create(context.Background(), sar); err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != c.allowed {
			t.Errorf("%s may %s %s.%s in namespace %q: %v, want %v (%s)", user, c.verb, c.resource, c.group, c.namespace, sar.Status.Allowed, c.allowed, sar.Status.Reason)
		}
	}
}

// checkWorkloadIdentity asks the workload cluster's API server
// (SubjectAccessReviews) what the provider's identity there may do: what
// the provider needs, no Secrets, and approving kubelet CSRs only when the
// Cluster asks for it. The Deployment mounts that identity's Secret, never
// Cluster API's admin kubeconfig.
func checkWorkloadIdentity(t *testing.T, c *world.WorkloadCluster, approveCSRs bool) {
	t.Helper()
	ctx := context.Background()
	d := &appsv1.Deployment{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Name + "-karpenter"}, d); err != nil {
		t.Fatal(err)
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == c.Name+"-kubeconfig" {
			t.Errorf("Cluster %s: the provider mounts Cluster API's admin kubeconfig (volume %s)", c.Name, v.Name)
		}
	}
	const user = "system:serviceaccount:kube-system:karpenter-clusterapi"
	cert := "certificates.k8s.io"
	cases := []struct {
		namespace, verb, group, resource, subresource, name string
		allowed                                             bool
	}{
		{"", "create", "karpenter.sh", "nodeclaims", "", "", true},
		{"", "patch", "karpenter.sh", "nodeclaims", "status", "", true},
		{"", "list", "karpenter.sh", "nodepools", "", "", true},
		{"", "watch", "karpenter.cluster.x-k8s.io", "clusterapinodeclasses", "", "", true},
		{"", "patch", "", "nodes", "", "", true},
		{"", "delete", "", "nodes", "", "", true},
		{"default", "list", "", "pods", "", "", true},
		{"default", "create", "", "pods", "eviction", "", true},
		{"kube-system", "create", "coordination.k8s.io", "leases", "", "", true},
		{"kube-system", "update", "coordination.k8s.io", "leases", "", "karpenter-leader-election", true},
		{"kube-system", "get", "", "secrets", "", "", false},
		{"", "list", "", "secrets", "", "", false},
		{"", "create", "apiextensions.k8s.io", "customresourcedefinitions", "", "", false},
		{"", "create", "rbac.authorization.k8s.io", "clusterrolebindings", "", "", false},
		{"", "list", cert, "certificatesigningrequests", "", "", approveCSRs},
		{"", "update", cert, "certificatesigningrequests", "approval", "", approveCSRs},
		{"", "approve", cert, "signers", "", "kubernetes.io/kubelet-serving", approveCSRs},
		{"", "approve", cert, "signers", "", "kubernetes.io/kube-apiserver-client-kubelet", approveCSRs},
		{"", "approve", cert, "signers", "", "kubernetes.io/kube-apiserver-client", false},
	}
	for _, k := range cases {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: k.namespace, Verb: k.verb, Group: k.group, Resource: k.resource, Subresource: k.subresource, Name: k.name,
			},
		}}
		if err := c.Spoke.Client.Create(ctx, sar); err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != k.allowed {
			t.Errorf("Cluster %s: the provider's workload identity may %s %s/%s.%s %q in namespace %q: %v, want %v (%s)",
				c.Name, k.verb, k.resource, k.subresource, k.group, k.name, k.namespace, sar.Status.Allowed, k.allowed, sar.Status.Reason)
		}
	}
}

// waitOwnNodes waits for n nodes of the pool in the Cluster's workload
// cluster, every one from a Machine of md (never of another Cluster), and
// the pods of autonode-app running.
func waitOwnNodes(t *testing.T, c *world.WorkloadCluster, pool string, md *clusterv1.MachineDeployment, n int) {
	t.Helper()
	var last string
	err := WaitFor(context.Background(), 3*time.Minute, func(ctx context.Context) (bool, error) {
		machines := &clusterv1.MachineList{}
		if err := w.Hub.Client.List(ctx, machines); err != nil {
			return false, err
		}
		owner := map[string]string{}
		for _, m := range machines.Items {
			if m.Spec.ProviderID != "" {
				owner[m.Spec.ProviderID] = m.Namespace + "/" + m.Labels[clusterv1.MachineDeploymentNameLabel]
			}
		}
		nodes := &corev1.NodeList{}
		if err := c.Spoke.Client.List(ctx, nodes, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
			return false, err
		}
		nodeNames := map[string]bool{}
		for _, node := range nodes.Items {
			if o, known := owner[node.Spec.ProviderID]; known && o != md.Namespace+"/"+md.Name {
				t.Fatalf("node %s of Cluster %s comes from MachineDeployment %s, not %s/%s", node.Name, c.Name, o, md.Namespace, md.Name)
			}
			nodeNames[node.Name] = true
		}
		pods := &corev1.PodList{}
		if err := c.Spoke.Client.List(ctx, pods, client.MatchingLabels{"app": "autonode-app"}); err != nil {
			return false, err
		}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && nodeNames[p.Spec.NodeName] {
				running++
			}
		}
		last = fmt.Sprintf("%d nodes, %d of %d pods running", len(nodes.Items), running, len(pods.Items))
		return len(nodes.Items) == n && running == len(pods.Items) && len(pods.Items) > 0, nil
	})
	if err != nil {
		t.Fatalf("Cluster %s: %v; last: %s", c.Name, err, last)
	}
}

// waitOptedOut waits until the Cluster's provider is gone, and fails if it
// went while Karpenter's NodeClaims or their Machines remained.
func waitOptedOut(t *testing.T, c *world.WorkloadCluster, md *clusterv1.MachineDeployment) {
	t.Helper()
	key := client.ObjectKey{Namespace: c.Namespace, Name: c.Name + "-karpenter"}
	var last string
	sawNodePoolsGone := false
	err := WaitFor(context.Background(), 3*time.Minute, func(ctx context.Context) (bool, error) {
		pools := &karpv1.NodePoolList{}
		if err := c.Spoke.Client.List(ctx, pools); err != nil {
			return false, err
		}
		claims := &karpv1.NodeClaimList{}
		if err := c.Spoke.Client.List(ctx, claims); err != nil {
			return false, err
		}
		machines := &clusterv1.MachineList{}
		if err := w.Hub.Client.List(ctx, machines, client.InNamespace(md.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
			return false, err
		}
		sawNodePoolsGone = sawNodePoolsGone || len(pools.Items) == 0
		err := w.Hub.Client.Get(ctx, key, &appsv1.Deployment{})
		gone := apierrors.IsNotFound(err)
		if err != nil && !gone {
			return false, err
		}
		last = fmt.Sprintf("nodepools=%d nodeclaims=%d machines=%d provider gone=%v", len(pools.Items), len(claims.Items), len(machines.Items), gone)
		if gone && len(claims.Items) > 0 {
			t.Fatalf("Cluster %s: the provider went before Karpenter's nodes: %s", c.Name, last)
		}
		return gone && len(machines.Items) == 0, nil
	})
	if err != nil {
		t.Fatalf("Cluster %s: opting out: %v; last: %s", c.Name, err, last)
	}
	if !sawNodePoolsGone {
		t.Errorf("Cluster %s: the NodePools were never deleted", c.Name)
	}
	for _, o := range []client.Object{&corev1.ServiceAccount{}, &rbacv1.RoleBinding{}, &corev1.ConfigMap{}, &corev1.Secret{}} {
		key := key
		if _, ok := o.(*corev1.Secret); ok {
			key.Name += "-workload"
		}
		if err := w.Hub.Client.Get(context.Background(), key, o); !apierrors.IsNotFound(err) {
			t.Errorf("%T %s still there after opting out: %v", o, key, err)
		}
	}
	// And the provider's identity in the workload cluster.
	for _, o := range []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "karpenter-clusterapi"}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "karpenter-clusterapi-core"}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "karpenter-clusterapi-workload"}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "karpenter-clusterapi-core"}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "karpenter-clusterapi-leader-election"}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-node-lease", Name: "karpenter-clusterapi-node-lease"}},
	} {
		if err := c.Spoke.Client.Get(context.Background(), client.ObjectKeyFromObject(o), o); !apierrors.IsNotFound(err) {
			t.Errorf("%T %s still in the workload cluster of %s after opting out: %v", o, client.ObjectKeyFromObject(o), c.Name, err)
		}
	}
	waitAutoNodeCondition(t, c, metav1.ConditionFalse, autonode.ReasonDisabled, "nodes removed")
}

// checkMalformedAndHandInstalled: c1 already has a provider (the suite's,
// run by hand). A malformed setting is reported and creates nothing; once
// valid, AutoNode refuses to add a second provider, seen by the provider
// Deployment in c1's workload cluster.
func checkMalformedAndHandInstalled(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	c1 := w.Cluster(w.ClusterName)
	marker := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "karpenter-clusterapi", Labels: map[string]string{"app.kubernetes.io/name": "karpenter-clusterapi"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](0),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "hand-installed"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "hand-installed"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "controller", Image: "ghcr.io/autonode/karpenter-clusterapi:hand"}}},
			},
		},
	}
	if err := c1.Spoke.Client.Create(ctx, marker); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c1.Spoke.Client.Delete(context.Background(), marker)
	})
	setClusterMetadata(t, c1, map[string]string{autonode.EnabledLabel: autonode.Enabled}, map[string]string{autonode.ReplicasAnnotation: "two"})
	t.Cleanup(func() {
		setClusterMetadata(t, c1, map[string]string{autonode.EnabledLabel: ""}, map[string]string{autonode.ReplicasAnnotation: ""})
	})
	cond := waitAutoNodeCondition(t, c1, metav1.ConditionFalse, autonode.ReasonInvalidSetting, autonode.ReplicasAnnotation)
	if !strings.Contains(cond.Message, w.Namespace+"/"+c1.Name) {
		t.Errorf("the condition does not name Cluster %s/%s: %s", w.Namespace, c1.Name, cond.Message)
	}
	waitClusterEvent(t, c1, corev1.EventTypeWarning, "AutoNode"+autonode.ReasonInvalidSetting, autonode.ReplicasAnnotation)
	setClusterMetadata(t, c1, nil, map[string]string{autonode.ReplicasAnnotation: "1"})
	waitAutoNodeCondition(t, c1, metav1.ConditionFalse, autonode.ReasonHandInstalledProvider, "Deployment kube-system/karpenter-clusterapi in the workload cluster")
	err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: w.Namespace, Name: c1.Name + "-karpenter"}, &appsv1.Deployment{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("AutoNode created a provider for c1, which has one already: %v", err)
	}
}

func waitClusterEvent(t *testing.T, c *world.WorkloadCluster, kind, reason, want string) {
	t.Helper()
	err := WaitFor(context.Background(), time.Minute, func(ctx context.Context) (bool, error) {
		events := &corev1.EventList{}
		if err := w.Hub.Client.List(ctx, events, client.InNamespace(c.Namespace)); err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.InvolvedObject.Kind == "Cluster" && e.InvolvedObject.Name == c.Name && e.Type == kind && e.Reason == reason && strings.Contains(e.Message, want) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s event %s on Cluster %s naming %q: %v", kind, reason, c.Name, want, err)
	}
}

// checkReadyMetric reads karpenter_clusterapi_autonode_ready of the Cluster
// from the controller's metrics endpoint.
func checkReadyMetric(t *testing.T, port int, c *world.WorkloadCluster, want float64) {
	t.Helper()
	p := &Provider{MetricsPort: port}
	series := fmt.Sprintf(`karpenter_clusterapi_autonode_ready{cluster=%q,namespace=%q}`, c.Name, c.Namespace)
	err := WaitFor(context.Background(), 30*time.Second, func(context.Context) (bool, error) {
		v, ok, err := p.Metric(series)
		return ok && v == want, err
	})
	if err != nil {
		t.Errorf("%s is not %v: %v", series, want, err)
	}
}
