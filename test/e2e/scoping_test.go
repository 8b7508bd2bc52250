package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// Scoping (issue 6): two Clusters in one hub namespace, each with its own
// workload cluster and its own provider, scoped with --cluster-api-namespace
// and --cluster-api-cluster-name and holding a hub Role in that namespace
// only. Both NodeClasses select the same pool label, and c2's
// MachineDeployment is the cheaper one: a provider that saw the other
// Cluster's MachineDeployments would launch there. Each Cluster's pods must
// get nodes from its own MachineDeployment only; neither provider may list,
// watch or read the other's Machines, MachineDeployments, MachineSets or
// Cluster (the hub's audit log of both providers' identities says what they
// asked for), nor write to any of the other's objects; no object of one
// Cluster may ever carry the other's NodeClaims.
func TestTwoClustersInOneNamespaceStayApart(t *testing.T) {
	ctx := context.Background()
	const c1Pool, c2Pool, selected = "scope-c1", "scope-c2", "scope"
	c2 := w.Cluster("c2")
	if c2 == nil {
		start := time.Now()
		var err error
		if c2, err = w.AddCluster(ctx, "c2"); err != nil {
			t.Fatal(err)
		}
		t.Logf("Cluster c2 with its workload cluster added in %s", time.Since(start).Round(100*time.Millisecond))
	}

	// Every object one Cluster owns is named after its MachineDeployment.
	c1MD, c2MD := "scope-c1-m5", "scope-c2-m5"
	watch := watchForeignClaims(t, map[string]string{w.ClusterName: c2Pool + "-", c2.Name: c1Pool + "-"})

	// Each provider gets a hub identity of its own: a Role in the namespace
	// only, and a group the hub's audit log records.
	c1Hub := auditedHubUser(t, "karpenter-"+w.ClusterName)
	c2Hub := auditedHubUser(t, "karpenter-"+c2.Name)
	provider.Stop() // the suite's provider serves c1 with the admin identity: replace it
	p1, err := StartProvider(bin, w, "scoping-c1.log", "--cluster-api-kubeconfig="+c1Hub)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := StartProviderForCluster(bin, w, c2, "scoping-c2.log", "--cluster-api-kubeconfig="+c2Hub)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpTail(p1.LogPath, 60)
			dumpTail(p2.LogPath, 60)
		}
		p1.Stop()
		p2.Stop()
		var err error
		if provider, err = StartProvider(bin, w, "provider.log"); err != nil {
			t.Errorf("restarting the suite's provider: %v", err)
		}
	})

	poolIn(t, w.Spoke.Client, c1Pool, selected)
	poolIn(t, c2.Spoke.Client, c2Pool, selected)
	md1 := machineDeploymentOf(t, w.ClusterName, selected, c1MD, "m5.large", "us-east-1a", map[string]string{v1alpha1.PriceAnnotation: "0.096"})
	md2 := machineDeploymentOf(t, c2.Name, selected, c2MD, "m5.large", "us-east-1b", map[string]string{v1alpha1.PriceAnnotation: "0.05"})
	d1 := deploymentIn(t, w.Spoke.Client, c1Pool, "scope-app", 3, "1500m")
	d2 := deploymentIn(t, c2.Spoke.Client, c2Pool, "scope-app", 3, "1500m")

	start := time.Now()
	seen1, seen2 := map[string]bool{}, map[string]bool{}
	waitScoped(t, 5*time.Minute, w.Spoke.Client, c1Pool, md1, 3, seen1)
	waitScoped(t, 5*time.Minute, c2.Spoke.Client, c2Pool, md2, 3, seen2)
	t.Logf("3 pods running in each workload cluster, each on its own Cluster's nodes, %s after the Deployments", time.Since(start).Round(time.Second))
	for _, p := range []*Provider{p1, p2} {
		if p.Exited() {
			t.Fatalf("a provider exited (log %s)", p.LogPath)
		}
	}

	// Each gives back only its own replicas.
	start = time.Now()
	for _, s := range []struct {
		spoke client.Client
		d     client.Object
	}{{w.Spoke.Client, d1}, {c2.Spoke.Client, d2}} {
		if err := s.spoke.Delete(ctx, s.d); err != nil {
			t.Fatal(err)
		}
	}
	waitScoped(t, 5*time.Minute, w.Spoke.Client, c1Pool, md1, 0, seen1)
	waitScoped(t, 5*time.Minute, c2.Spoke.Client, c2Pool, md2, 0, seen2)
	t.Logf("both scaled to zero %s after the Deployments were deleted", time.Since(start).Round(time.Second))

	for _, v := range watch.stop() {
		t.Error(v)
	}
	events, err := w.HubAudit()
	if err != nil {
		t.Fatal(err)
	}
	checkAudit(t, events, watch, "karpenter-"+w.ClusterName, w.ClusterName, c2.Name, c2MD)
	checkAudit(t, events, watch, "karpenter-"+c2.Name, c2.Name, w.ClusterName, c1MD)
}

// deploymentIn creates a Deployment of pause pods of the pool, each
// requesting cpu, in a workload cluster, and deletes it at the end.
func deploymentIn(t *testing.T, spoke client.Client, pool, name string, replicas int32, cpu string) *appsv1.Deployment {
	t.Helper()
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{karpv1.NodePoolLabelKey: pool},
					TerminationGracePeriodSeconds: new(int64),
					Containers: []corev1.Container{{
						Name: "app", Image: "registry.k8s.io/pause:3.10",
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}},
					}},
				},
			},
		},
	}
	if err := spoke.Create(context.Background(), d); err != nil {
		t.Fatalf("creating Deployment %s: %v", name, err)
	}
	t.Cleanup(func() { _ = spoke.Delete(context.Background(), d) })
	return d
}

// waitScoped waits until the pool's pods all run, on exactly n nodes of the
// workload cluster, with md at n replicas and n bound Machines. Every node
// of the pool must come from md all along: its providerID is one of md's
// Machines' (seen accumulates them, as a Machine may go before its Node).
func waitScoped(t *testing.T, timeout time.Duration, spoke client.Client, pool string, md *clusterv1.MachineDeployment, n int, seen map[string]bool) {
	t.Helper()
	var last string
	err := WaitFor(context.Background(), timeout, func(ctx context.Context) (bool, error) {
		cur := &clusterv1.MachineDeployment{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKeyFromObject(md), cur); err != nil {
			return false, err
		}
		machines := &clusterv1.MachineList{}
		if err := w.Hub.Client.List(ctx, machines, client.InNamespace(md.Namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}); err != nil {
			return false, err
		}
		bound := 0
		for _, m := range machines.Items {
			if m.Spec.ProviderID != "" {
				seen[m.Spec.ProviderID] = true
			}
			if m.Annotations[v1alpha1.NodeClaimAnnotation] != "" {
				bound++
			}
		}
		nodes := &corev1.NodeList{}
		if err := spoke.List(ctx, nodes, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
			return false, err
		}
		// A Node can register before Cluster API copies its providerID to
		// the Machine: a node is foreign only when the providerID belongs to
		// a Machine of another MachineDeployment.
		all := &clusterv1.MachineList{}
		if err := w.Hub.Client.List(ctx, all, client.InNamespace(md.Namespace)); err != nil {
			return false, err
		}
		owner := map[string]string{}
		for _, m := range all.Items {
			if m.Spec.ProviderID != "" {
				owner[m.Spec.ProviderID] = m.Labels[clusterv1.MachineDeploymentNameLabel]
			}
		}
		nodeOf := map[string]string{}
		var foreign []string
		for _, node := range nodes.Items {
			nodeOf[node.Name] = node.Spec.ProviderID
			if o, known := owner[node.Spec.ProviderID]; !seen[node.Spec.ProviderID] && known && o != md.Name {
				foreign = append(foreign, node.Name+"="+node.Spec.ProviderID+" (MachineDeployment "+o+")")
			}
		}
		claims := &karpv1.NodeClaimList{}
		if err := spoke.List(ctx, claims, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
			return false, err
		}
		pods := &corev1.PodList{}
		if err := spoke.List(ctx, pods, client.MatchingLabels{"app": "scope-app"}); err != nil {
			return false, err
		}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && nodeOf[p.Spec.NodeName] != "" && p.DeletionTimestamp.IsZero() {
				running++
			}
		}
		replicas := int32(-1)
		if cur.Spec.Replicas != nil {
			replicas = *cur.Spec.Replicas
		}
		last = fmt.Sprintf("%s: replicas=%d machines=%d bound=%d nodeclaims=%d nodes=%d running pods=%d of %d; nodes not from %s: %v",
			md.Name, replicas, len(machines.Items), bound, len(claims.Items), len(nodes.Items), running, len(pods.Items), md.Name, foreign)
		if len(foreign) > 0 {
			t.Fatalf("a node of NodePool %s does not come from MachineDeployment %s: %s", pool, md.Name, last)
		}
		wantPods := n
		if n == 0 {
			wantPods = len(pods.Items) // deleted with the Deployment
		}
		return replicas == int32(n) && len(machines.Items) == n && bound == n && len(claims.Items) == n &&
			len(nodes.Items) == n && running == wantPods, nil
	})
	if err != nil {
		t.Fatalf("%v; last: %s", err, last)
	}
}

const rbacProbeUserAgent = "scoping-test-rbac-probe"

// auditedHubUser adds a hub user holding config/rbac/hub/role.yaml's rules
// as a Role in the world's namespace, in world.AuditedGroup, and returns its
// kubeconfig.
func auditedHubUser(t *testing.T, name string) string {
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
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: w.Namespace, Name: name}, Rules: clusterRole.Rules}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.Namespace, Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: name}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := w.Hub.Client.Create(ctx, o); client.IgnoreAlreadyExists(err) != nil {
			t.Fatal(err)
		}
	}
	u, err := w.Hub.Env.ControlPlane.AddUser(envtest.User{Name: name, Groups: []string{world.AuditedGroup}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	probe := u.Config()
	probe.UserAgent = rbacProbeUserAgent // not the provider's request: checkAudit skips it
	limited, err := client.New(probe, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := limited.List(ctx, &clusterv1.MachineList{}, client.InNamespace("kube-system")); !apierrors.IsForbidden(err) {
		t.Fatalf("hub user %s must not read Machines outside %s, got %v", name, w.Namespace, err)
	}
	kubeconfig, err := u.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(w.Dir, name+".hub.kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// checkAudit fails the test for every request of user (the provider of
// Cluster own) that reaches beyond its namespace and Cluster: a list or
// watch of Machines, MachineSets or MachineDeployments not restricted to
// own's cluster-name label, of Clusters not restricted to own's name, or any
// other request (read or write) to an object of Cluster other: a Machine,
// MachineSet or MachineDeployment the watch saw labelled for other, or an
// object named after other or its MachineDeployment otherMD (Cluster,
// Secrets, infrastructure machines, events). It also wants to see the
// provider's own scoped lists and watches, so that an empty log proves nothing.
func checkAudit(t *testing.T, events []world.AuditEvent, watch *foreignClaimWatch, user, own, other, otherMD string) {
	t.Helper()
	scopedLists := map[string]int{}
	namespaceWide := map[string]bool{}
	var violations []string
	seen := map[string]bool{}
	report := func(e world.AuditEvent, why string) {
		key := e.Verb + " " + e.RequestURI + ": " + why
		if !seen[key] {
			seen[key] = true
			violations = append(violations, key)
		}
	}
	for _, e := range events {
		if e.User.Username != user || e.ObjectRef == nil || e.UserAgent == rbacProbeUserAgent {
			continue
		}
		ref := e.ObjectRef
		if ref.Namespace != w.Namespace {
			report(e, fmt.Sprintf("outside namespace %s", w.Namespace))
			continue
		}
		u, err := url.Parse(e.RequestURI)
		if err != nil {
			report(e, err.Error())
			continue
		}
		q := u.Query()
		switch e.Verb {
		case "list", "watch":
			if ref.APIGroup != clusterv1.GroupVersion.Group {
				// Templates carry no cluster-name label (and may be shared):
				// they are read namespace-wide. Say which.
				namespaceWide[ref.Resource+"."+ref.APIGroup] = true
				continue
			}
			switch ref.Resource {
			case "machines", "machinesets", "machinedeployments":
				sel, err := labels.Parse(q.Get("labelSelector"))
				if err != nil {
					report(e, err.Error())
					continue
				}
				if v, ok := sel.RequiresExactMatch(clusterv1.ClusterNameLabel); !ok || v != own {
					report(e, fmt.Sprintf("label selector %q does not restrict to Cluster %s", q.Get("labelSelector"), own))
					continue
				}
				scopedLists[ref.Resource]++
			case "clusters":
				sel, err := fields.ParseSelector(q.Get("fieldSelector"))
				if err != nil {
					report(e, err.Error())
					continue
				}
				if v, ok := sel.RequiresExactMatch("metadata.name"); !ok || v != own {
					report(e, fmt.Sprintf("field selector %q does not restrict to Cluster %s", q.Get("fieldSelector"), own))
					continue
				}
				scopedLists[ref.Resource]++
			}
		default:
			if watch.clusterOf(ref.Resource, ref.Name) == other ||
				ref.Name == other || ref.Name == otherMD || strings.HasPrefix(ref.Name, otherMD+"-") || strings.HasPrefix(ref.Name, other+"-") {
				report(e, fmt.Sprintf("%s of Cluster %s's object %s %s", e.Verb, other, ref.Resource, ref.Name))
			}
		}
	}
	sort.Strings(violations)
	for _, v := range violations {
		t.Errorf("provider of %s (hub user %s) reached beyond its Cluster: %s", own, user, v)
	}
	// Informers list by watching (client-go's WatchListClient): a watch
	// with initial events is the list.
	for _, want := range []string{"machines", "machinedeployments", "clusters"} {
		if scopedLists[want] == 0 {
			t.Errorf("the hub audit log has no list or watch of %s scoped to %s by %s (seen: %v): the audit proves nothing", want, own, user, scopedLists)
		}
	}
	t.Logf("hub user %s: %d audited requests checked; scoped lists and watches by resource: %v; read namespace-wide: %v",
		user, countOf(events, user), scopedLists, slices.Sorted(maps.Keys(namespaceWide)))
}

func countOf(events []world.AuditEvent, user string) int {
	n := 0
	for _, e := range events {
		if e.User.Username == user {
			n++
		}
	}
	return n
}

// foreignClaimWatch records every version of a Machine or MachineDeployment
// that names, in the provider's bookkeeping, a NodeClaim of the other
// Cluster's workload cluster, and the Cluster of every Machine, MachineSet
// and MachineDeployment it saw.
type foreignClaimWatch struct {
	cancel     context.CancelFunc
	mu         sync.Mutex
	violations []string
	clusters   map[string]string // "<resource>/<name>" -> cluster-name label
}

// clusterOf is the cluster-name label the object of resource (plural, e.g.
// "machines") and name had when last seen, or "".
func (fw *foreignClaimWatch) clusterOf(resource, name string) string {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	return fw.clusters[resource+"/"+name]
}

// watchForeignClaims watches the hub's Machines and MachineDeployments;
// foreignPrefix maps a Cluster to the name prefix of NodeClaims that must
// never appear on its objects.
func watchForeignClaims(t *testing.T, foreignPrefix map[string]string) *foreignClaimWatch {
	t.Helper()
	c, err := cache.New(w.Hub.Config, cache.Options{Scheme: scheme.Scheme, DefaultNamespaces: map[string]cache.Config{w.Namespace: {}}})
	if err != nil {
		t.Fatal(err)
	}
	fw := &foreignClaimWatch{clusters: map[string]string{}}
	check := func(o any) {
		obj, ok := o.(client.Object)
		if !ok {
			return
		}
		cluster := obj.GetLabels()[clusterv1.ClusterNameLabel]
		resource := map[string]string{"*v1beta2.Machine": "machines", "*v1beta2.MachineSet": "machinesets", "*v1beta2.MachineDeployment": "machinedeployments"}[fmt.Sprintf("%T", obj)]
		fw.mu.Lock()
		fw.clusters[resource+"/"+obj.GetName()] = cluster
		fw.mu.Unlock()
		prefix, ok := foreignPrefix[cluster]
		if !ok {
			return
		}
		var names []string
		if claim := obj.GetAnnotations()[v1alpha1.NodeClaimAnnotation]; claim != "" {
			names = append(names, claim)
		}
		pending, _ := hub.PendingNodeClaims(obj)
		for claim := range pending {
			names = append(names, claim)
		}
		for _, name := range names {
			if strings.HasPrefix(name, prefix) {
				fw.mu.Lock()
				fw.violations = append(fw.violations, fmt.Sprintf("%T %s of Cluster %s names NodeClaim %s of the other workload cluster (resourceVersion %s)",
					obj, obj.GetName(), cluster, name, obj.GetResourceVersion()))
				fw.mu.Unlock()
			}
		}
	}
	handler := toolscache.ResourceEventHandlerFuncs{AddFunc: check, UpdateFunc: func(_, o any) { check(o) }}
	ctx, cancel := context.WithCancel(context.Background())
	fw.cancel = cancel
	for _, o := range []client.Object{&clusterv1.Machine{}, &clusterv1.MachineSet{}, &clusterv1.MachineDeployment{}} {
		inf, err := c.GetInformer(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			t.Fatal(err)
		}
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("hub watch did not sync")
	}
	t.Cleanup(cancel)
	return fw
}

func (fw *foreignClaimWatch) stop() []string {
	fw.cancel()
	fw.mu.Lock()
	defer fw.mu.Unlock()
	return append([]string(nil), fw.violations...)
}
