package e2ecapa

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/test/e2e"
	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world"
	"github.com/autonode/karpenter-clusterapi/test/world/ec2sim"
)

// publishedWorkerTemplate is the worker AWSMachineTemplate of CAPA's own
// cluster-template.yaml (what `clusterctl generate cluster` writes), with
// clusterctl's variables substituted. Its spec has no AMI: CAPA looks one up
// by the Machine's Kubernetes version, as for a real user.
func publishedWorkerTemplate(t testing.TB, name, instanceType string) *infrav1.AWSMachineTemplate {
	t.Helper()
	dir, err := environment.ModuleDir("sigs.k8s.io/cluster-api-provider-aws/v2")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "templates", "cluster-template.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.NewReplacer("${CLUSTER_NAME}", w.ClusterName, "${AWS_NODE_MACHINE_TYPE}", instanceType,
		"${AWS_SSH_KEY_NAME}", "default").Replace(string(raw))
	docs := utilyaml.NewDocumentDecoder(nopCloser{bytes.NewReader([]byte(text))})
	defer docs.Close()
	buf := make([]byte, 1<<20)
	for {
		n, err := docs.Read(buf)
		if err != nil {
			break
		}
		doc := buf[:n]
		var meta metav1.PartialObjectMetadata
		if yaml.Unmarshal(doc, &meta) != nil || meta.Kind != "AWSMachineTemplate" || meta.Name != w.ClusterName+"-md-0" {
			continue
		}
		if bytes.Contains(doc, []byte("${")) {
			t.Fatalf("unsubstituted variable in CAPA's worker template: %s", doc)
		}
		tmpl := &infrav1.AWSMachineTemplate{}
		if err := yaml.Unmarshal(doc, tmpl); err != nil {
			t.Fatal(err)
		}
		tmpl.Namespace, tmpl.Name = w.Namespace, name
		return tmpl
	}
	t.Fatal("no worker AWSMachineTemplate in CAPA's cluster-template.yaml")
	return nil
}

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }

// createTemplate creates a template (labels and annotations added) and
// deletes it at the end.
func createTemplate(t testing.TB, tmpl *infrav1.AWSMachineTemplate, labels, annotations map[string]string) *infrav1.AWSMachineTemplate {
	t.Helper()
	if tmpl.Labels == nil {
		tmpl.Labels = map[string]string{}
	}
	tmpl.Labels[clusterv1.ClusterNameLabel] = w.ClusterName
	for k, v := range labels {
		tmpl.Labels[k] = v
	}
	tmpl.Annotations = annotations
	if p := tmpl.Labels["pool"]; p != "" {
		// CAPA tags the instances with it: each scenario sees its own.
		tmpl.Spec.Template.Spec.AdditionalTags = infrav1.Tags{"pool": p}
	}
	if err := w.Hub.Client.Create(context.Background(), tmpl); err != nil {
		t.Fatalf("creating AWSMachineTemplate %s: %v", tmpl.Name, err)
	}
	t.Cleanup(func() { _ = w.Hub.Client.Delete(context.Background(), tmpl) })
	return tmpl
}

// capacityAnnotations are the scale-from-zero annotations of an instance
// type: what a user adds to a template CAPA has not described yet.
func capacityAnnotations(instanceType string, more map[string]string) map[string]string {
	it := world.InstanceTypes[instanceType]
	out := map[string]string{
		"capacity.cluster-autoscaler.kubernetes.io/cpu":    it.CPU.String(),
		"capacity.cluster-autoscaler.kubernetes.io/memory": it.Memory.String(),
		"capacity.cluster-autoscaler.kubernetes.io/labels": "kubernetes.io/arch=" + it.Arch,
	}
	for k, v := range more {
		out[k] = v
	}
	return out
}

// nodePool creates a NodePool over a NodeClass; both go at the end.
func nodePool(t testing.TB, name string, spec v1alpha1.ClusterAPINodeClassSpec, capacityTypes ...string) {
	t.Helper()
	ctx := context.Background()
	if len(capacityTypes) == 0 {
		capacityTypes = []string{karpv1.CapacityTypeOnDemand}
	}
	nc := &v1alpha1.ClusterAPINodeClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	np := &karpv1.NodePool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: karpv1.NodePoolSpec{
			Template: karpv1.NodeClaimTemplate{Spec: karpv1.NodeClaimTemplateSpec{
				NodeClassRef: &karpv1.NodeClassReference{Group: v1alpha1.Group, Kind: "ClusterAPINodeClass", Name: name},
				Requirements: []karpv1.NodeSelectorRequirementWithMinValues{
					{Key: corev1.LabelOSStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"linux"}},
					{Key: karpv1.CapacityTypeLabelKey, Operator: corev1.NodeSelectorOpIn, Values: capacityTypes},
				},
				ExpireAfter: karpv1.MustParseNillableDuration("Never"),
			}},
			Disruption: karpv1.Disruption{
				ConsolidationPolicy: karpv1.ConsolidationPolicyWhenEmptyOrUnderutilized,
				ConsolidateAfter:    karpv1.MustParseNillableDuration("5s"),
				Budgets:             []karpv1.Budget{{Nodes: "100%"}},
			},
		},
	}
	for _, o := range []client.Object{nc, np} {
		if err := w.Spoke.Client.Create(ctx, o); err != nil {
			t.Fatalf("creating %T %s: %v", o, name, err)
		}
	}
	t.Cleanup(func() {
		_ = w.Spoke.Client.Delete(ctx, np)
		_ = w.Spoke.Client.Delete(ctx, nc)
	})
}

// machineModePool is a Machine-mode NodePool over the templates labelled pool=<name>.
func machineModePool(t testing.TB, name string, capacityTypes ...string) {
	t.Helper()
	nodePool(t, name, v1alpha1.ClusterAPINodeClassSpec{MachineTemplate: &v1alpha1.MachineTemplate{
		InfrastructureTemplates: v1alpha1.InfrastructureTemplates{
			APIGroup: infrav1.GroupVersion.Group, Kind: "AWSMachineTemplate",
			Selector: metav1.LabelSelector{MatchLabels: map[string]string{"pool": name}},
		},
		Bootstrap: v1alpha1.Bootstrap{DataSecretName: &w.BootstrapSecretName},
		Metadata:  v1alpha1.MachineMetadata{Labels: map[string]string{"pool": name}},
	}}, capacityTypes...)
}

// machineDeploymentPool is a MachineDeployment-mode NodePool over the
// MachineDeployments labelled pool=<name>.
func machineDeploymentPool(t testing.TB, name string, capacityTypes ...string) {
	t.Helper()
	nodePool(t, name, v1alpha1.ClusterAPINodeClassSpec{
		ScalableResourceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": name}},
	}, capacityTypes...)
}

// memberMachineDeployment creates a Karpenter-member MachineDeployment at 0
// replicas over a template, in a zone, with the Kubernetes version set as
// clusterctl's templates set it; it is deleted at the end.
func memberMachineDeployment(t testing.TB, pool, name, template, zone string, annotations map[string]string) *clusterv1.MachineDeployment {
	t.Helper()
	md := environment.NewMachineDeployment(environment.MachineDeploymentOptions{
		Namespace: w.Namespace, Name: name, ClusterName: w.ClusterName, Member: true, InfraTemplate: template,
		Labels: map[string]string{"pool": pool}, Annotations: annotations, FailureDomain: zone,
	})
	md.Spec.Template.Spec.Version = world.KubeletVersion
	md.Spec.Rollout.Strategy.Type = clusterv1.OnDeleteMachineDeploymentStrategyType
	if err := w.Hub.Client.Create(context.Background(), md); err != nil {
		t.Fatalf("creating MachineDeployment %s: %v", name, err)
	}
	t.Cleanup(func() { _ = w.Hub.Client.Delete(context.Background(), md) })
	return md
}

// app creates a Deployment of pause pods on the pool's nodes, each
// requesting cpu; it is deleted at the end.
func app(t testing.TB, pool, name string, replicas int32, cpu string) *appsv1.Deployment {
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
	if err := w.Spoke.Client.Create(context.Background(), d); err != nil {
		t.Fatalf("creating Deployment %s: %v", name, err)
	}
	t.Cleanup(func() { _ = w.Spoke.Client.Delete(context.Background(), d) })
	return d
}

func scale(t testing.TB, d *appsv1.Deployment, replicas int32) {
	t.Helper()
	cur := &appsv1.Deployment{}
	if err := w.Spoke.Client.Get(context.Background(), client.ObjectKeyFromObject(d), cur); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	cur.Spec.Replicas = &replicas
	if err := w.Spoke.Client.Patch(context.Background(), cur, patch); err != nil {
		t.Fatal(err)
	}
}

// view is what a user sees of a pool at one moment, in both clusters and
// on the EC2 bill.
type view struct {
	RunningPods, PendingPods int
	NodeClaims               int
	Nodes                    []corev1.Node
	// Machines are the pool's Machines not being deleted; Deleting those
	// being deleted (CAPA requeues a deleted AWSMachine a minute after
	// TerminateInstances: deletions take a minute or more).
	Machines, Deleting []clusterv1.Machine
	// Instances are the live EC2 instances of the pool's Machines' providerIDs
	// plus any other live instance of the cluster (a leak shows here).
	Instances []ec2sim.Instance
}

func (v view) String() string {
	var types []string
	for _, n := range v.Nodes {
		types = append(types, n.Labels[corev1.LabelInstanceTypeStable]+"/"+n.Labels[corev1.LabelTopologyZone]+"/"+n.Labels[karpv1.CapacityTypeLabelKey])
	}
	sort.Strings(types)
	return fmt.Sprintf("pods running=%d pending=%d, nodeclaims=%d, nodes=%d %v, machines=%d (+%d deleting), live EC2 instances=%d",
		v.RunningPods, v.PendingPods, v.NodeClaims, len(v.Nodes), types, len(v.Machines), len(v.Deleting), len(v.Instances))
}

// look gathers a pool's view; app selects its pods.
func look(ctx context.Context, pool, appName string) (view, error) {
	var v view
	pods := &corev1.PodList{}
	if err := w.Spoke.Client.List(ctx, pods, client.MatchingLabels{"app": appName}); err != nil {
		return v, err
	}
	for _, p := range pods.Items {
		switch {
		case !p.DeletionTimestamp.IsZero():
		case p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != "":
			v.RunningPods++
		default:
			v.PendingPods++
		}
	}
	ncs := &karpv1.NodeClaimList{}
	if err := w.Spoke.Client.List(ctx, ncs, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
		return v, err
	}
	v.NodeClaims = len(ncs.Items)
	nodes := &corev1.NodeList{}
	if err := w.Spoke.Client.List(ctx, nodes, client.MatchingLabels{karpv1.NodePoolLabelKey: pool}); err != nil {
		return v, err
	}
	v.Nodes = nodes.Items
	machines := &clusterv1.MachineList{}
	if err := w.Hub.Client.List(ctx, machines, client.InNamespace(w.Namespace)); err != nil {
		return v, err
	}
	for _, m := range machines.Items {
		if m.Labels["pool"] != pool && !strings.HasPrefix(m.Labels[clusterv1.MachineDeploymentNameLabel], pool+"-") {
			continue
		}
		if m.DeletionTimestamp.IsZero() {
			v.Machines = append(v.Machines, m)
		} else {
			v.Deleting = append(v.Deleting, m)
		}
	}
	for _, in := range w.EC2.Live() {
		if in.Tags["pool"] == pool {
			v.Instances = append(v.Instances, in)
		}
	}
	return v, nil
}

// waitView waits until want holds and returns the view, or fails with the last one.
func waitView(t testing.TB, timeout time.Duration, pool, appName string, want func(view) bool) view {
	t.Helper()
	var last view
	start := time.Now()
	err := e2e.WaitFor(context.Background(), timeout, func(ctx context.Context) (bool, error) {
		v, err := look(ctx, pool, appName)
		if err != nil {
			return false, err
		}
		last = v
		return want(v), nil
	})
	if err != nil {
		t.Fatalf("pool %s: %v; last: %s", pool, err, last)
	}
	t.Logf("pool %s after %s: %s", pool, time.Since(start).Round(time.Second), last)
	return last
}

// checkIdentity checks the chain a user relies on: every Node's providerID
// is its Machine's, and names a running EC2 instance of the Node's type and
// zone (CAPA's format aws:///<zone>/i-...).
//
// Cluster API copies the providerID onto the Machine only once CAPA reports
// the AWSMachine provisioned, which may be after the Node registered and
// its pods started: a launch returns when the instance has an ID, and this
// world's bootstrap does not register Nodes with Cluster API's
// uninitialized taint (CABPK's would, holding pods until the copy). So a
// Node whose Machine does not show its providerID yet gets a minute for
// Cluster API to copy it.
func checkIdentity(t testing.TB, v view) {
	t.Helper()
	byProviderID := map[string]clusterv1.Machine{}
	for _, m := range v.Machines {
		byProviderID[m.Spec.ProviderID] = m
	}
	for _, n := range v.Nodes {
		if _, ok := byProviderID[n.Spec.ProviderID]; !ok && !machineGetsProviderID(n.Spec.ProviderID) {
			t.Errorf("Node %s (providerID %q) has no Machine (Cluster API did not copy it onto one within a minute)", n.Name, n.Spec.ProviderID)
		}
		zone, id, ok := strings.Cut(strings.TrimPrefix(n.Spec.ProviderID, "aws:///"), "/")
		if !ok || !strings.HasPrefix(id, "i-") {
			t.Errorf("Node %s: providerID %q is not CAPA's aws:///<zone>/i-...", n.Name, n.Spec.ProviderID)
			continue
		}
		in, found := w.EC2.Instance(id)
		switch {
		case !found:
			t.Errorf("Node %s: no EC2 instance %s", n.Name, id)
		case in.State != ec2sim.StateRunning:
			t.Errorf("Node %s: instance %s is %s", n.Name, id, in.State)
		case in.Zone != zone || in.Zone != n.Labels[corev1.LabelTopologyZone]:
			t.Errorf("Node %s: instance %s runs in %s; providerID says %s, the zone label %s", n.Name, id, in.Zone, zone, n.Labels[corev1.LabelTopologyZone])
		case in.Type != n.Labels[corev1.LabelInstanceTypeStable]:
			t.Errorf("Node %s: instance %s is a %s, the Node says %s", n.Name, id, in.Type, n.Labels[corev1.LabelInstanceTypeStable])
		case (in.Market == ec2sim.Spot) != (n.Labels[karpv1.CapacityTypeLabelKey] == karpv1.CapacityTypeSpot):
			t.Errorf("Node %s: instance %s is %s, the Node's capacity type %s", n.Name, id, in.Market, n.Labels[karpv1.CapacityTypeLabelKey])
		}
	}
}

// copied reports whether every Machine of the view carries its providerID.
func copied(v view) bool {
	for _, m := range v.Machines {
		if m.Spec.ProviderID == "" {
			return false
		}
	}
	return true
}

// machineGetsProviderID waits up to a minute for a Machine of the cluster's
// namespace to carry the providerID.
func machineGetsProviderID(id string) bool {
	err := e2e.WaitFor(context.Background(), time.Minute, func(ctx context.Context) (bool, error) {
		list := &clusterv1.MachineList{}
		if err := w.Hub.Client.List(ctx, list, client.InNamespace(w.Namespace)); err != nil {
			return false, nil
		}
		for _, m := range list.Items {
			if m.Spec.ProviderID == id {
				return true, nil
			}
		}
		return false, nil
	})
	return err == nil
}

// drained is the end state of a scenario: no pods, nodes, NodeClaims or
// Machines of the pool, and no EC2 instance left running (the simulator
// counts them) nor bootstrap data left in Secrets Manager.
func drained(v view) bool {
	return v.RunningPods == 0 && v.NodeClaims == 0 && len(v.Nodes) == 0 && len(v.Machines) == 0 && len(v.Deleting) == 0 && len(v.Instances) == 0
}

// scaleToZeroAndCheckNothingLeaks scales the app to zero and waits until
// the pool is empty and EC2 runs nothing.
func scaleToZeroAndCheckNothingLeaks(t testing.TB, d *appsv1.Deployment, pool string) {
	t.Helper()
	scale(t, d, 0)
	waitView(t, 4*time.Minute, pool, d.Name, drained)
	if err := e2e.WaitFor(context.Background(), time.Minute, func(context.Context) (bool, error) {
		return w.EC2.SecretCount() == 0, nil
	}); err != nil {
		t.Errorf("%d bootstrap data secrets left in Secrets Manager", w.EC2.SecretCount())
	}
}

// memberTemplate creates a Karpenter-member template of the pool from CAPA's
// published worker template.
func memberTemplate(t testing.TB, pool, name, instanceType string, annotations map[string]string, mutate func(*infrav1.AWSMachineSpec)) *infrav1.AWSMachineTemplate {
	t.Helper()
	tmpl := publishedWorkerTemplate(t, name, instanceType)
	if mutate != nil {
		mutate(&tmpl.Spec.Template.Spec)
	}
	return createTemplate(t, tmpl, map[string]string{v1alpha1.KarpenterMemberLabel: "", "pool": pool}, annotations)
}

// limitCapacity limits an EC2 pool for the test.
func limitCapacity(t testing.TB, p ec2sim.Pool, n int) {
	t.Helper()
	w.EC2.SetCapacity(p, n)
	t.Cleanup(func() { w.EC2.SetCapacity(p, -1) })
}

// launchErrors is how many launches of an instance type EC2 refused with code so far.
func launchErrors(code, instanceType string) int { return w.EC2.LaunchErrors(code, instanceType) }

// waitUnavailableOffering waits until the NodeClass lists the offering
// (instance type, zone, capacity type; empty zone matches any) as unavailable.
func waitUnavailableOffering(t testing.TB, nodeClass, instanceType, zone, capacityType string) {
	t.Helper()
	var shown []v1alpha1.UnavailableOffering
	err := e2e.WaitFor(context.Background(), time.Minute, func(ctx context.Context) (bool, error) {
		nc := &v1alpha1.ClusterAPINodeClass{}
		if err := w.Spoke.Client.Get(ctx, client.ObjectKey{Name: nodeClass}, nc); err != nil {
			return false, err
		}
		shown = nc.Status.UnavailableOfferings
		for _, o := range shown {
			if o.InstanceType == instanceType && (zone == "" || o.Zone == zone) && o.CapacityType == capacityType {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("NodeClass %s: want %s/%s/%s among the unavailable offerings, got %+v", nodeClass, instanceType, zone, capacityType, shown)
	}
}

// capaReport is what CAPA wrote on a pool's AWSMachine about a launch:
// the InstanceReady condition and the failure fields.
type capaReport struct {
	AWSMachine, Reason, Severity, Message string
	FailureReason, FailureMessage         string
}

// recordCAPAReports polls the pool's AWSMachines (CAPA tags the template's
// additionalTags) until the test ends and returns a function listing the
// distinct failed-launch reports seen: what the provider had to read.
func recordCAPAReports(t testing.TB, pool string) func() []capaReport {
	t.Helper()
	var mu sync.Mutex
	seen := map[string]capaReport{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			list := &infrav1.AWSMachineList{}
			if err := w.Hub.Client.List(ctx, list, client.InNamespace(w.Namespace)); err == nil {
				for _, m := range list.Items {
					if m.Spec.AdditionalTags["pool"] != pool {
						continue
					}
					for _, c := range m.Status.Conditions {
						if c.Type != infrav1.InstanceReadyCondition || c.Status != corev1.ConditionFalse || c.Severity != "Error" {
							continue
						}
						r := capaReport{AWSMachine: m.Name, Reason: c.Reason, Severity: string(c.Severity), Message: c.Message}
						if m.Status.FailureReason != nil {
							r.FailureReason = *m.Status.FailureReason
						}
						if m.Status.FailureMessage != nil {
							r.FailureMessage = *m.Status.FailureMessage
						}
						mu.Lock()
						seen[m.Name+"/"+c.Reason] = r
						mu.Unlock()
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func() []capaReport {
		mu.Lock()
		defer mu.Unlock()
		out := make([]capaReport, 0, len(seen))
		for _, r := range seen {
			out = append(out, r)
		}
		return out
	}
}

// checkCAPAReportedLaunchFailure checks that CAPA reported a refused launch
// the way the provider reads it: InstanceReady False, reason
// InstanceProvisionFailed, severity Error, the EC2 error code in the message.
func checkCAPAReportedLaunchFailure(t testing.TB, reports []capaReport, code string) {
	t.Helper()
	for _, r := range reports {
		t.Logf("CAPA wrote on AWSMachine %s: InstanceReady=False reason=%s severity=%s failureReason=%q message=%q",
			r.AWSMachine, r.Reason, r.Severity, r.FailureReason, r.Message)
	}
	for _, r := range reports {
		if r.Reason == infrav1.InstanceProvisionFailedReason && strings.Contains(r.Message, "api error "+code+":") {
			return
		}
	}
	t.Errorf("CAPA reported no InstanceProvisionFailed naming %s", code)
}
