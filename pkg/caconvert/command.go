package caconvert

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Command is the subcommand of the provider binary that runs the
// conversion: karpenter-clusterapi convert-cluster-autoscaler [flags].
const Command = "convert-cluster-autoscaler"

// FieldManager owns what --apply writes.
const FieldManager = "karpenter-clusterapi-convert"

const usage = `Usage: karpenter-clusterapi ` + Command + ` [flags]

Reads the MachineDeployments and MachineSets that cluster-autoscaler scales
(both cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size and -max-size
set) from the management cluster and writes to stdout the NodeClasses and
NodePools for the workload cluster, the labels to add to the management
cluster's objects, and, as comments at the top, a report of what was carried
over and what was not. With --apply, applies them with server-side apply (a
second run changes nothing).

Flags:
`

// Main runs the subcommand with args (after the subcommand's name) and
// returns the exit code: 0 when the conversion ran (node groups it could not
// convert are in the report), 1 when a cluster could not be read or written,
// 2 for bad flags.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(Command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	hubKubeconfig := fs.String("cluster-api-kubeconfig", os.Getenv("CLUSTER_API_KUBECONFIG"),
		"kubeconfig of the management cluster holding the Cluster API objects (default: --kubeconfig)")
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"),
		"kubeconfig of the workload cluster, where --apply puts the NodeClasses and NodePools (default: in-cluster)")
	namespace := fs.String("namespace", "", "namespace of the Cluster(s) in the management cluster (default: all namespaces)")
	clusterName := fs.String("cluster-name", "", "convert only the node groups of this Cluster (required with --apply when several Clusters have node groups)")
	selector := fs.String("selector", "", "convert only the MachineDeployments and MachineSets with these labels, e.g. the labels of cluster-autoscaler's --node-group-auto-discovery (color=green,shape=square)")
	expander := fs.String("expander", "random", "cluster-autoscaler's --expander value, e.g. priority,least-waste")
	priorityConfig := fs.String("priority-config", "", "the priority expander's ConfigMap (cluster-autoscaler-priority-expander) as a YAML file, or its data.priorities")
	apply := fs.Bool("apply", false, "apply the result with server-side apply instead of printing it")
	var assume stringList
	fs.Var(&assume, "assume-node-group", "a MachineDeployment or MachineSet (<name> or <namespace>/<name>; repeatable, or comma-separated) whose min-size annotation you removed to stop cluster-autoscaler: converted with max-size alone")
	forceCluster := fs.Bool("force-cluster", false, "with --apply, write even when --kubeconfig does not look like the Cluster's workload cluster")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "karpenter-clusterapi %s: unexpected argument %q\n", Command, fs.Arg(0))
		return 2
	}
	settings := Settings{AssumeNodeGroups: assume}
	var err error
	if settings.Expanders, err = ParseExpanders(*expander); err != nil {
		fmt.Fprintf(stderr, "karpenter-clusterapi %s: %v\n", Command, err)
		return 2
	}
	if *priorityConfig != "" {
		data, err := os.ReadFile(*priorityConfig)
		if err == nil {
			settings.Priorities, err = ParsePriorities(data)
		}
		if err != nil {
			fmt.Fprintf(stderr, "karpenter-clusterapi %s: --priority-config %s: %v\n", Command, *priorityConfig, err)
			return 2
		}
	}
	hubPath := *hubKubeconfig
	if hubPath == "" {
		hubPath = *kubeconfig
	}
	hub, err := newClient(hubPath)
	if err != nil {
		fmt.Fprintf(stderr, "karpenter-clusterapi %s: --cluster-api-kubeconfig: %v\n", Command, err)
		return 1
	}
	sel, err := labels.Parse(*selector)
	if err != nil {
		fmt.Fprintf(stderr, "karpenter-clusterapi %s: --selector: %v\n", Command, err)
		return 2
	}
	in, err := Read(ctx, hub, *namespace, *clusterName, sel)
	if err != nil {
		fmt.Fprintf(stderr, "karpenter-clusterapi %s: reading the management cluster: %v\n", Command, err)
		return 1
	}
	res := Convert(in, settings)
	if !*apply {
		if err := Render(stdout, res); err != nil {
			fmt.Fprintf(stderr, "karpenter-clusterapi %s: %v\n", Command, err)
			return 1
		}
		return 0
	}
	if len(res.Clusters) > 1 {
		fmt.Fprintf(stderr, "karpenter-clusterapi %s: --apply: node groups of several Clusters (%s): each Cluster's NodePools go to its own workload cluster; run once per Cluster with --cluster-name\n",
			Command, strings.Join(res.Clusters, ", "))
		return 2
	}
	workload, workloadHost, err := newClientHost(*kubeconfig)
	if err != nil {
		fmt.Fprintf(stderr, "karpenter-clusterapi %s: --kubeconfig: %v\n", Command, err)
		return 1
	}
	if len(res.Clusters) == 1 && !*forceCluster {
		if err := CheckWorkload(ctx, hub, workload, workloadHost, res.Clusters[0]); err != nil {
			fmt.Fprintf(stderr, "karpenter-clusterapi %s: --apply: %v; nothing written (--force-cluster writes anyway)\n", Command, err)
			return 1
		}
	}
	fmt.Fprint(stdout, Report(res.Findings))
	outcomes, err := Apply(ctx, hub, workload, res)
	if err == nil {
		var pruned []Outcome
		pruned, err = Prune(ctx, hub, workload, res, in)
		outcomes = append(outcomes, pruned...)
	}
	for _, o := range outcomes {
		fmt.Fprintln(stdout, o)
	}
	if err != nil {
		fmt.Fprintf(stderr, "karpenter-clusterapi %s: --apply: %v\n", Command, err)
		return 1
	}
	return 0
}

// Scheme holds the kinds Read lists.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = clusterv1.AddToScheme(s)
	return s
}

func newClient(kubeconfig string) (client.Client, error) {
	c, _, err := newClientHost(kubeconfig)
	return c, err
}

// stringList is a repeatable, comma-separated flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// newClientHost is newClient and the API server it talks to.
func newClientHost(kubeconfig string) (client.Client, string, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, "", err
	}
	cfg.UserAgent = FieldManager
	c, err := client.New(cfg, client.Options{Scheme: Scheme()})
	return c, cfg.Host, err
}

// Read lists the node groups' objects in the namespace (all when empty),
// of the Cluster when clusterName is set, matching the selector (nil:
// all), and the infrastructure templates they name. A template that does not exist, or whose kind the cluster does
// not serve, is left out of Input.Templates; any other error is returned.
func Read(ctx context.Context, c client.Client, namespace, clusterName string, selector labels.Selector) (Input, error) {
	in := Input{Templates: map[TemplateKey]*unstructured.Unstructured{}}
	opts := []client.ListOption{}
	if selector != nil && !selector.Empty() {
		opts = append(opts, client.MatchingLabelsSelector{Selector: selector})
	}
	if namespace != "" {
		opts = append(opts, client.InNamespace(namespace))
	}
	mds := &clusterv1.MachineDeploymentList{}
	if err := c.List(ctx, mds, opts...); err != nil {
		return in, fmt.Errorf("listing MachineDeployments: %w", err)
	}
	mss := &clusterv1.MachineSetList{}
	if err := c.List(ctx, mss, opts...); err != nil {
		return in, fmt.Errorf("listing MachineSets: %w", err)
	}
	var refs []TemplateKey
	for _, md := range mds.Items {
		if clusterName == "" || md.Spec.ClusterName == clusterName {
			in.MachineDeployments = append(in.MachineDeployments, md)
			refs = append(refs, TemplateKey{md.Namespace, md.Spec.Template.Spec.InfrastructureRef.APIGroup, md.Spec.Template.Spec.InfrastructureRef.Kind, md.Spec.Template.Spec.InfrastructureRef.Name})
		}
	}
	for _, ms := range mss.Items {
		if clusterName == "" || ms.Spec.ClusterName == clusterName {
			in.MachineSets = append(in.MachineSets, ms)
			refs = append(refs, TemplateKey{ms.Namespace, ms.Spec.Template.Spec.InfrastructureRef.APIGroup, ms.Spec.Template.Spec.InfrastructureRef.Kind, ms.Spec.Template.Spec.InfrastructureRef.Name})
		}
	}
	sort.Slice(refs, func(i, j int) bool { return refs[i].String() < refs[j].String() })
	for _, ref := range refs {
		if _, done := in.Templates[ref]; done || ref.Name == "" || ref.Kind == "" {
			continue
		}
		mapping, err := c.RESTMapper().RESTMapping(schema.GroupKind{Group: ref.APIGroup, Kind: ref.Kind})
		if meta.IsNoMatchError(err) {
			continue
		}
		if err != nil {
			return in, fmt.Errorf("%s: %w", ref, err)
		}
		t := &unstructured.Unstructured{}
		t.SetGroupVersionKind(mapping.GroupVersionKind)
		if err := c.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, t); err != nil {
			if client.IgnoreNotFound(err) == nil {
				continue
			}
			return in, fmt.Errorf("reading %s: %w", ref, err)
		}
		in.Templates[ref] = t
	}
	return in, nil
}
