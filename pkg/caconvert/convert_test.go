package caconvert

import (
	"bytes"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/autonode/karpenter-clusterapi/pkg/apis/v1alpha1"
	"github.com/autonode/karpenter-clusterapi/pkg/capacity"
)

const ns = "team"

var awsGroup = "infrastructure.cluster.x-k8s.io"

func tmplSpec(cluster, infra string) clusterv1.MachineTemplateSpec {
	secret := cluster + "-bootstrap"
	return clusterv1.MachineTemplateSpec{Spec: clusterv1.MachineSpec{
		ClusterName:       cluster,
		Bootstrap:         clusterv1.Bootstrap{DataSecretName: &secret},
		InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: awsGroup, Kind: "AWSMachineTemplate", Name: infra},
		Version:           "v1.33.1",
	}}
}

func md(cluster, name string, replicas int32, ann map[string]string) clusterv1.MachineDeployment {
	return clusterv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann},
		Spec:       clusterv1.MachineDeploymentSpec{ClusterName: cluster, Replicas: &replicas, Template: tmplSpec(cluster, name)},
	}
}

func withLabels(m clusterv1.MachineDeployment, labels map[string]string) clusterv1.MachineDeployment {
	m.Labels = labels
	return m
}

func ms(cluster, name string, ann map[string]string, owner string) clusterv1.MachineSet {
	m := clusterv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann},
		Spec:       clusterv1.MachineSetSpec{ClusterName: cluster, Template: tmplSpec(cluster, name)},
	}
	m.Spec.Template.Spec.Bootstrap = clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{APIGroup: "bootstrap.cluster.x-k8s.io", Kind: "KubeadmConfigTemplate", Name: name + "-bootstrap"}}
	if owner != "" {
		m.OwnerReferences = []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: KindMachineDeployment, Name: owner, UID: "u"}}
	}
	return m
}

func template(name string, spec, status map[string]any) (TemplateKey, *unstructured.Unstructured) {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": awsGroup + "/v1beta2", "kind": "AWSMachineTemplate",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"template": map[string]any{"spec": spec}},
	}}
	if status != nil {
		u.Object["status"] = status
	}
	return TemplateKey{ns, awsGroup, "AWSMachineTemplate", name}, u
}

// sized are the annotations of a node group sized from zero.
func sized(min, max, cpu, mem string, more ...string) map[string]string {
	a := map[string]string{MinSizeAnnotation: min, MaxSizeAnnotation: max, capacity.CPUKey: cpu, capacity.MemoryKey: mem}
	for i := 0; i+1 < len(more); i += 2 {
		a[more[i]] = more[i+1]
	}
	return a
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

func str(t *testing.T, o *unstructured.Unstructured, path ...string) string {
	t.Helper()
	if o == nil {
		t.Fatalf("object missing (want %v)", path)
	}
	v, found, err := unstructured.NestedFieldNoCopy(o.Object, path...)
	if !found || err != nil {
		return ""
	}
	switch x := v.(type) {
	case string:
		return x
	default:
		b, _ := yaml.ToJSON([]byte(strings.TrimSpace(toYAML(x))))
		return string(b)
	}
}

func toYAML(v any) string {
	var b bytes.Buffer
	_ = Render(&b, Result{Workload: []*unstructured.Unstructured{{Object: map[string]any{"v": v}}}})
	s := b.String()
	return s[strings.Index(s, "v:")+2:]
}

// finding returns the first finding on the object and field, or fails.
func finding(t *testing.T, res Result, object, field string) Finding {
	t.Helper()
	for _, f := range res.Findings {
		if f.Object == object && f.Field == field {
			return f
		}
	}
	t.Fatalf("no finding on %s %s; report:\n%s", object, field, Report(res.Findings))
	return Finding{}
}

func TestConvert(t *testing.T) {
	allOptions := map[string]string{
		OptionsPrefix + "scaledownutilizationthreshold":    "0.5",
		OptionsPrefix + "scaledowngpuutilizationthreshold": "0.5",
		OptionsPrefix + "scaledownunneededtime":            "20m0s",
		OptionsPrefix + "scaledownunreadytime":             "20m0s",
		OptionsPrefix + "maxnodeprovisiontime":             "20m0s",
	}
	cases := []struct {
		name      string
		in        Input
		settings  Settings
		nodePools int
		check     func(t *testing.T, res Result)
	}{{
		name: "every documented annotation, scaled from zero",
		in: Input{MachineDeployments: []clusterv1.MachineDeployment{md("c1", "c1-gpu", 0, func() map[string]string {
			a := sized("0", "5", "16", "128G",
				capacity.EphemeralDiskKey, "100Gi", capacity.MaxPodsKey, "200", capacity.GPUTypeKey, "nvidia.com/gpu", capacity.GPUCountKey, "2",
				capacity.LabelsKey, "node.kubernetes.io/instance-type=p3.8xlarge,accelerator=v100,karpenter.sh/team=gpu", capacity.TaintsKey, "nvidia.com/gpu=present:NoSchedule",
				DRADriverKey, "gpu.nvidia.com")
			for k, v := range allOptions {
				a[k] = v
			}
			return a
		}())}},
		nodePools: 1,
		check: func(t *testing.T, res Result) {
			np := find(res.Workload, "NodePool", "c1-gpu")
			if got := str(t, np, "spec", "limits", "nodes"); got != "5" {
				t.Errorf("limits.nodes %q, want 5 (max-size)", got)
			}
			if got := str(t, np, "spec", "limits", "cpu"); got != "80" {
				t.Errorf("limits.cpu %q, want 80 (5 x 16)", got)
			}
			if got := str(t, np, "spec", "limits", "memory"); got != "640G" {
				t.Errorf("limits.memory %q, want 640G", got)
			}
			if got := str(t, np, "spec", "disruption", "consolidateAfter"); got != "20m0s" {
				t.Errorf("consolidateAfter %q, want 20m0s from scaledownunneededtime", got)
			}
			if got := str(t, np, "spec", "template", "spec", "taints"); !strings.Contains(got, `"nvidia.com/gpu"`) || !strings.Contains(got, "NoSchedule") {
				t.Errorf("taints %s, want nvidia.com/gpu=present:NoSchedule", got)
			}
			nc := find(res.Workload, "ClusterAPINodeClass", "c1-gpu")
			if got := str(t, nc, "spec", "scalableResourceSelector", "matchLabels", NodeClassLabel); got != "c1-gpu" {
				t.Errorf("NodeClass selects %q", got)
			}
			obj := "MachineDeployment team/c1-gpu"
			for _, k := range []string{capacity.CPUKey, capacity.MemoryKey, capacity.EphemeralDiskKey, capacity.MaxPodsKey, capacity.GPUTypeKey, capacity.GPUCountKey, capacity.LabelsKey, capacity.TaintsKey, MaxSizeAnnotation, OptionsPrefix + "scaledownunneededtime"} {
				if f := finding(t, res, obj, k); f.Kind != Mapped {
					t.Errorf("%s: %s, want mapped", k, f)
				}
			}
			for _, k := range []string{DRADriverKey, OptionsPrefix + "scaledownutilizationthreshold", OptionsPrefix + "scaledowngpuutilizationthreshold", OptionsPrefix + "scaledownunreadytime", OptionsPrefix + "maxnodeprovisiontime"} {
				if f := finding(t, res, obj, k); f.Kind != NotCarried || len(f.Message) < 20 {
					t.Errorf("%s: %s, want not-carried with a reason", k, f)
				}
			}
			if got := str(t, np, "spec", "template", "metadata", "labels", "accelerator"); got != "v100" {
				t.Errorf("label accelerator on the NodePool: %q", got)
			}
			if f := finding(t, res, "NodePool c1-gpu", "karpenter.sh/team"); f.Kind != NotCarried {
				t.Errorf("a label a NodePool may not set: %s", f)
			}
			hub := find(res.Hub, KindMachineDeployment, "c1-gpu")
			if _, ok := hub.GetLabels()[v1alpha1.KarpenterMemberLabel]; !ok || hub.GetLabels()[NodeClassLabel] != "c1-gpu" || hub.GetNamespace() != ns {
				t.Errorf("member labels to add: %v", hub.Object)
			}
		},
	}, {
		name: "node groups differing only in instance type and zone share a NodePool; taints split",
		in: Input{MachineDeployments: []clusterv1.MachineDeployment{
			md("c1", "c1-m5-a", 0, sized("1", "3", "2", "8Gi", capacity.LabelsKey, "node.kubernetes.io/instance-type=m5.large,topology.kubernetes.io/zone=a,team=x")),
			md("c1", "c1-c5-b", 2, sized("0", "4", "4", "8Gi", capacity.LabelsKey, "node.kubernetes.io/instance-type=c5.xlarge,topology.kubernetes.io/zone=b,team=x")),
			withLabels(md("c1", "c1-tainted", 0, sized("0", "2", "2", "8Gi", capacity.TaintsKey, "dedicated=db:NoSchedule")),
				map[string]string{clusterv1.ClusterTopologyOwnedLabel: "", clusterv1.ClusterTopologyMachineDeploymentNameLabel: "db"}),
			md("c1", "c1-not-a-group", 3, nil),
		}},
		nodePools: 2,
		check: func(t *testing.T, res Result) {
			np := find(res.Workload, "NodePool", "c1-c5-b")
			if got := str(t, np, "spec", "limits", "nodes"); got != "7" {
				t.Errorf("merged limits.nodes %q, want 3+4", got)
			}
			if got := str(t, np, "spec", "limits", "cpu"); got != "22" {
				t.Errorf("merged limits.cpu %q, want 3x2+4x4", got)
			}
			if got := str(t, np, "spec", "template", "metadata", "labels", "team"); got != "x" {
				t.Errorf("shared label team=x not declared on the NodePool: %q", got)
			}
			if got := str(t, np, "spec", "template", "metadata", "labels", "node.kubernetes.io/instance-type"); got != "" {
				t.Errorf("a label that varies between node groups declared on the NodePool: %q", got)
			}
			if got := np.GetAnnotations()[ConvertedFromAnnotation]; got != "MachineDeployment team/c1-c5-b, MachineDeployment team/c1-m5-a" {
				t.Errorf("converted-from %q", got)
			}
			if f := finding(t, res, "MachineDeployment team/c1-m5-a", MinSizeAnnotation); f.Kind != Todo || !strings.Contains(f.Message, "1 kept") || !strings.Contains(f.Message, "Remove the annotation") {
				t.Errorf("min-size 1: %s, want a todo saying it is kept, what it costs and how to remove it", f)
			}
			if f := finding(t, res, "MachineDeployment team/c1-c5-b", "spec.replicas"); f.Kind != Todo {
				t.Errorf("running replicas: %s", f)
			}
			if find(res.Hub, KindMachineDeployment, "c1-not-a-group") != nil {
				t.Error("a MachineDeployment without size annotations was converted")
			}
			if f := finding(t, res, "MachineDeployment team/c1-tainted", "metadata.labels"); f.Kind != Todo || !strings.Contains(f.Message, "workers.machineDeployments[name=db]") {
				t.Errorf("topology-owned: %s", f)
			}
			if got := str(t, find(res.Workload, "NodePool", "c1-tainted"), "spec", "template", "spec", "taints"); !strings.Contains(got, "dedicated") {
				t.Errorf("tainted pool taints %s", got)
			}
		},
	}, {
		name: "malformed annotations are reported per object and the rest converted",
		in: Input{MachineDeployments: []clusterv1.MachineDeployment{
			md("c1", "c1-good", 0, sized("0", "2", "2", "8Gi")),
			md("c1", "c1-min-word", 0, sized("one", "2", "2", "8Gi")),
			md("c1", "c1-max-negative", 0, sized("0", "-1", "2", "8Gi")),
			md("c1", "c1-max-below-min", 0, sized("3", "2", "2", "8Gi")),
			md("c1", "c1-cpu-lots", 0, sized("0", "2", "lots", "8Gi")),
			md("c1", "c1-bad-taint", 0, sized("0", "2", "2", "8Gi", capacity.TaintsKey, "nocolon")),
			md("c1", "c1-bad-gpu", 0, sized("0", "2", "2", "8Gi", capacity.GPUCountKey, "many")),
			md("c1", "c1-only-max", 0, map[string]string{MaxSizeAnnotation: "2", capacity.CPUKey: "2", capacity.MemoryKey: "8Gi"}),
		}},
		nodePools: 1,
		check: func(t *testing.T, res Result) {
			for obj, field := range map[string]string{
				"c1-min-word": MinSizeAnnotation, "c1-max-negative": MaxSizeAnnotation, "c1-max-below-min": MaxSizeAnnotation,
				"c1-cpu-lots": capacity.CPUKey, "c1-bad-taint": capacity.TaintsKey, "c1-bad-gpu": capacity.GPUCountKey, "c1-only-max": MinSizeAnnotation,
			} {
				if f := finding(t, res, "MachineDeployment team/"+obj, field); f.Kind != Skipped {
					t.Errorf("%s: %s, want skipped", obj, f)
				}
			}
			if find(res.Workload, "NodePool", "c1-good") == nil {
				t.Error("the good node group was not converted")
			}
		},
	}, {
		name: "no node size: no capacity annotations and no template, or a template without status.capacity; a template's status.capacity sizes one",
		in: func() Input {
			in := Input{Templates: map[TemplateKey]*unstructured.Unstructured{}, MachineDeployments: []clusterv1.MachineDeployment{
				md("c1", "c1-no-template", 0, map[string]string{MinSizeAnnotation: "0", MaxSizeAnnotation: "2"}),
				md("c1", "c1-empty-template", 0, map[string]string{MinSizeAnnotation: "0", MaxSizeAnnotation: "2"}),
				md("c1", "c1-sized-template", 0, map[string]string{MinSizeAnnotation: "0", MaxSizeAnnotation: "2"}),
			}}
			k, u := template("c1-empty-template", map[string]any{"instanceType": "m5.large"}, nil)
			in.Templates[k] = u
			k, u = template("c1-sized-template", map[string]any{"instanceType": "m5.large"}, map[string]any{"capacity": map[string]any{"cpu": "2", "memory": "8Gi"}})
			in.Templates[k] = u
			return in
		}(),
		nodePools: 1,
		check: func(t *testing.T, res Result) {
			if f := finding(t, res, "MachineDeployment team/c1-no-template", capacity.CPUKey); f.Kind != Skipped || !strings.Contains(f.Message, "does not exist") {
				t.Errorf("no template: %s", f)
			}
			if f := finding(t, res, "MachineDeployment team/c1-empty-template", capacity.CPUKey); f.Kind != Skipped || !strings.Contains(f.Message, "status.capacity") {
				t.Errorf("template without capacity: %s", f)
			}
			if got := str(t, find(res.Workload, "NodePool", "c1-sized-template"), "spec", "limits", "memory"); got != "16Gi" {
				t.Errorf("sized from the template: memory limit %q", got)
			}
		},
	}, {
		name: "a standalone MachineSet becomes Machine mode; one of a MachineDeployment is not a node group",
		in: func() Input {
			in := Input{Templates: map[TemplateKey]*unstructured.Unstructured{}, MachineSets: []clusterv1.MachineSet{
				ms("c1", "c1-batch", sized("0", "6", "8", "32Gi", capacity.LabelsKey, "node.kubernetes.io/instance-type=m5.2xlarge"), ""),
				ms("c1", "c1-md-abc", sized("0", "6", "8", "32Gi"), "c1-md"),
			}}
			k, u := template("c1-batch", map[string]any{"instanceType": "m5.2xlarge", "spotMarketOptions": map[string]any{}}, nil)
			in.Templates[k] = u
			return in
		}(),
		nodePools: 1,
		check: func(t *testing.T, res Result) {
			nc := find(res.Workload, "ClusterAPINodeClass", "c1-batch")
			if got := str(t, nc, "spec", "machineTemplate", "infrastructureTemplates", "kind"); got != "AWSMachineTemplate" {
				t.Errorf("Machine mode template kind %q", got)
			}
			if got := str(t, nc, "spec", "machineTemplate", "bootstrap", "configRef", "name"); got != "c1-batch-bootstrap" {
				t.Errorf("bootstrap configRef %q", got)
			}
			if got := str(t, nc, "spec", "machineTemplate", "version"); got != "v1.33.1" {
				t.Errorf("version %q", got)
			}
			if got := str(t, find(res.Workload, "NodePool", "c1-batch"), "spec", "template", "spec", "requirements"); !strings.Contains(got, `"spot"`) || strings.Contains(got, "on-demand") {
				t.Errorf("a spot template's NodePool requirements: %s", got)
			}
			tmpl := find(res.Hub, "AWSMachineTemplate", "c1-batch")
			if tmpl == nil || tmpl.GetLabels()[NodeClassLabel] != "c1-batch" || tmpl.GetAnnotations()[capacity.CPUKey] != "8" {
				t.Fatalf("template patch %v: want member labels and the capacity annotations copied", tmpl)
			}
			if find(res.Hub, KindMachineSet, "c1-batch") != nil {
				t.Error("the MachineSet itself was patched")
			}
			for _, f := range res.Findings {
				if f.Object == "MachineSet team/c1-md-abc" {
					t.Errorf("a MachineSet of a MachineDeployment reported (Cluster API copies the MachineDeployment's annotations onto it): %s", f)
				}
			}
		},
	}, {
		name: "several Clusters in one namespace",
		in: Input{MachineDeployments: []clusterv1.MachineDeployment{
			md("alpha", "workers", 0, sized("0", "3", "2", "8Gi")),
			md("beta", "workers-b", 0, sized("0", "3", "2", "8Gi")),
			md("beta", "workers-c", 0, sized("0", "3", "2", "8Gi", capacity.TaintsKey, "x=y:NoExecute")),
		}},
		nodePools: 3,
		check: func(t *testing.T, res Result) {
			if strings.Join(res.Clusters, ",") != "team/alpha,team/beta" {
				t.Errorf("clusters %v", res.Clusters)
			}
			if np := find(res.Workload, "NodePool", "alpha-workers"); np == nil || ClusterOf(np) != "team/alpha" {
				t.Errorf("alpha's NodePool: %v", np)
			}
			if np := find(res.Workload, "NodePool", "beta-workers-b"); np == nil || ClusterOf(np) != "team/beta" {
				t.Errorf("beta's NodePool: %v", np)
			}
		},
	}, {
		name: "priority expander becomes weights; the rest is said",
		in: Input{MachineDeployments: []clusterv1.MachineDeployment{
			md("c1", "c1-spot", 0, sized("0", "3", "2", "8Gi", capacity.LabelsKey, "tier=cheap")),
			md("c1", "c1-ondemand", 0, sized("0", "3", "2", "8Gi")),
		}},
		settings: func() Settings {
			p, err := ParsePriorities([]byte("apiVersion: v1\nkind: ConfigMap\ndata:\n  priorities: |-\n    10:\n      - .*ondemand.*\n    50:\n      - MachineDeployment/team/c1-spot\n"))
			if err != nil {
				panic(err)
			}
			return Settings{Expanders: []string{"priority", "least-waste"}, Priorities: p}
		}(),
		nodePools: 2,
		check: func(t *testing.T, res Result) {
			if got := str(t, find(res.Workload, "NodePool", "c1-spot"), "spec", "weight"); got != "50" {
				t.Errorf("c1-spot weight %q, want 50", got)
			}
			if got := str(t, find(res.Workload, "NodePool", "c1-ondemand"), "spec", "weight"); got != "10" {
				t.Errorf("c1-ondemand weight %q, want 10", got)
			}
			if f := finding(t, res, "--expander", "least-waste"); f.Kind != NotCarried {
				t.Errorf("least-waste: %s", f)
			}
			if f := finding(t, res, "--expander", "priority"); f.Kind != Mapped {
				t.Errorf("priority: %s", f)
			}
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := Convert(tc.in, tc.settings)
			n := 0
			for _, o := range res.Workload {
				if o.GetKind() == "NodePool" {
					n++
					if find(res.Workload, "ClusterAPINodeClass", o.GetName()) == nil {
						t.Errorf("NodePool %s without its NodeClass", o.GetName())
					}
				}
			}
			if n != tc.nodePools {
				t.Errorf("%d NodePools, want %d; report:\n%s", n, tc.nodePools, Report(res.Findings))
			}
			tc.check(t, res)
			// Deterministic: a second conversion renders the same bytes.
			var a, b bytes.Buffer
			if err := Render(&a, res); err != nil {
				t.Fatal(err)
			}
			if err := Render(&b, Convert(tc.in, tc.settings)); err != nil {
				t.Fatal(err)
			}
			if a.String() != b.String() {
				t.Errorf("two conversions of the same input differ")
			}
			checkParses(t, a.Bytes())
		})
	}
}

// checkParses decodes the rendered stream: every document is an object.
func checkParses(t *testing.T, data []byte) {
	t.Helper()
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if err.Error() == "EOF" {
				return
			}
			t.Fatalf("rendered output does not parse: %v\n%s", err, data)
		}
		if obj != nil && (obj["kind"] == nil || obj["apiVersion"] == nil) {
			t.Fatalf("a document without kind or apiVersion: %v", obj)
		}
	}
}

func TestParseExpandersAndPriorities(t *testing.T) {
	if _, err := ParseExpanders("priority,cheapest"); err == nil || !strings.Contains(err.Error(), "cheapest") {
		t.Errorf("unknown expander: %v", err)
	}
	for _, bad := range []string{"ten:\n - x", "10:\n - '('", "apiVersion: v1\nkind: ConfigMap\ndata: {}\n", "- a"} {
		if _, err := ParsePriorities([]byte(bad)); err == nil {
			t.Errorf("ParsePriorities(%q) accepted", bad)
		}
	}
	if w := weights([]int{5, 500, 5000}); w[5] != 1 || w[5000] != 3 {
		t.Errorf("priorities beyond 100 ranked: %v", w)
	}
}

func TestPoolNamesAreLabelValues(t *testing.T) {
	taken := map[string]bool{}
	long := strings.Repeat("x", 70)
	a, b := poolName("c", long, taken), poolName("c", long, taken)
	if len(a) > 63 || len(b) > 63 || a == b {
		t.Errorf("names %q %q", a, b)
	}
	if got := poolName("c1", "c1-workers", taken); got != "c1-workers" {
		t.Errorf("cluster prefix doubled: %q", got)
	}
}

// The migration's order: min-size removed to stop cluster-autoscaler, then
// --apply. Without a sign that it was on purpose the group is skipped and
// the message names the flag; named by --assume-node-group, or labelled
// by an earlier --apply, it is converted with no minimum.
func TestAGroupWhoseMinSizeWasRemovedOnPurposeIsConverted(t *testing.T) {
	onlyMax := map[string]string{MaxSizeAnnotation: "4", capacity.CPUKey: "2", capacity.MemoryKey: "8Gi"}
	plain := md("c1", "c1-general", 1, onlyMax)
	in := Input{Templates: map[TemplateKey]*unstructured.Unstructured{}, MachineDeployments: []clusterv1.MachineDeployment{plain}}
	res := Convert(in, Settings{})
	if len(res.Workload) != 0 {
		t.Fatalf("converted without a sign: %d objects", len(res.Workload))
	}
	if f := finding(t, res, "MachineDeployment team/c1-general", MinSizeAnnotation); f.Kind != Skipped || !strings.Contains(f.Message, "--assume-node-group=c1-general") {
		t.Errorf("skipped without naming the flag: %s", f)
	}

	res = Convert(in, Settings{AssumeNodeGroups: []string{"team/c1-general"}})
	if len(res.Workload) != 2 || len(res.Hub) != 1 {
		t.Fatalf("--assume-node-group: %d workload and %d hub objects, want 2 and 1; report:\n%s", len(res.Workload), len(res.Hub), Report(res.Findings))
	}
	if f := finding(t, res, "MachineDeployment team/c1-general", MinSizeAnnotation); f.Kind != Mapped || !strings.Contains(f.Message, "--assume-node-group") {
		t.Errorf("--assume-node-group: %s", f)
	}
	name := res.Workload[0].GetName()

	labelled := md("c1", "c1-general", 1, onlyMax)
	labelled.Labels = map[string]string{NodeClassLabel: name, "node.cluster.x-k8s.io/karpenter-member": ""}
	again := Convert(Input{Templates: in.Templates, MachineDeployments: []clusterv1.MachineDeployment{labelled}}, Settings{})
	if len(again.Workload) != 2 || again.Workload[0].GetName() != name {
		t.Fatalf("re-run on the labelled MachineDeployment: %d objects; report:\n%s", len(again.Workload), Report(again.Findings))
	}
	if f := finding(t, again, "MachineDeployment team/c1-general", MinSizeAnnotation); f.Kind != Mapped || !strings.Contains(f.Message, "converted before") {
		t.Errorf("re-run: %s", f)
	}
}
