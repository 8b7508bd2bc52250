package autonode

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	coreoperator "sigs.k8s.io/karpenter/pkg/operator"
)

// Command is the subcommand that runs the AutoNode controller:
// `karpenter-clusterapi autonode [flags]`.
const Command = "autonode"

// DefaultImageRepository is the provider's image; the tag is the
// controller's own version.
const DefaultImageRepository = "ghcr.io/autonode/karpenter-clusterapi"

// syncPeriod: how soon a knob set on a control plane object is seen.
const syncPeriod = 5 * time.Minute

// DefaultHubClusterRole is config/rbac/hub's ClusterRole.
const DefaultHubClusterRole = "karpenter-clusterapi-hub"

type commandOptions struct {
	kubeconfig, image, version, hubClusterRole string
	metricsAddr, probeAddr                     string
	leaderElect                                bool
	leaderElectionNamespace                    string
}

func parseFlags(args []string, stderr io.Writer) (commandOptions, *zap.Options, error) {
	o := commandOptions{}
	fs := flag.NewFlagSet("karpenter-clusterapi "+Command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "management cluster kubeconfig; in-cluster config when unset")
	fs.StringVar(&o.version, "version", coreoperator.Version, "the version AutoNode reports and deploys (the provider image's tag)")
	fs.StringVar(&o.image, "provider-image", "", "the provider image each Cluster runs (default "+DefaultImageRepository+":<version>)")
	fs.StringVar(&o.hubClusterRole, "hub-cluster-role", DefaultHubClusterRole, "ClusterRole with the provider's management-cluster rules, bound in each Cluster's namespace")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "metrics address (0 disables)")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "health probe address (0 disables)")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "leader election, for more than one replica")
	fs.StringVar(&o.leaderElectionNamespace, "leader-election-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the leader election Lease (default: the Pod's)")
	zo := &zap.Options{}
	zo.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return o, nil, err
	}
	if fs.NArg() > 0 {
		return o, nil, fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	if o.image == "" {
		o.image = DefaultImageRepository + ":" + o.version
	}
	return o, zo, nil
}

// Main runs the AutoNode controller until ctx ends or a signal stops it.
func Main(ctx context.Context, args []string, stderr io.Writer) int {
	o, zo, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "karpenter-clusterapi %s: %v\n", Command, err)
		return 2
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(zo), zap.WriteTo(stderr)))
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(stderr, "karpenter-clusterapi %s: %v\n", Command, err)
		return 1
	}
	return 0
}

func run(ctx context.Context, o commandOptions) error {
	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	mgr, err := newManager(cfg, o)
	if err != nil {
		return err
	}
	r := &Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), RESTMapper: mgr.GetRESTMapper(),
		Config:   Config{Image: o.image, Version: o.version, HubClusterRole: o.hubClusterRole},
		Recorder: mgr.GetEventRecorderFor(ManagedBy), //nolint:staticcheck // core/v1 events, as Cluster API's own
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctrl.SetupSignalHandler().Done()
		cancel()
	}()
	ctrl.Log.WithName(Command).Info("starting", "version", o.version, "providerImage", o.image)
	return mgr.Start(ctx)
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return ctrl.GetConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

// Scheme of the management cluster as AutoNode reads it.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, clusterv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// newManager caches only what AutoNode reads: Clusters, provider
// Deployments (its own and hand-installed ones, by the provider's name
// label) and Secrets labelled with a Cluster (kubeconfigs).
func newManager(cfg *rest.Config, o commandOptions) (ctrl.Manager, error) {
	s, err := Scheme()
	if err != nil {
		return nil, err
	}
	hasCluster, err := labels.NewRequirement(clusterv1.ClusterNameLabel, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        s,
		Metrics:                       metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress:        o.probeAddr,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              "karpenter-clusterapi-autonode",
		LeaderElectionNamespace:       o.leaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		// A knob on a control plane object (no watch of every control plane
		// kind) is seen within this period.
		Cache: cache.Options{SyncPeriod: ptr.To(syncPeriod), ByObject: map[client.Object]cache.ByObject{
			&appsv1.Deployment{}: {Label: labels.SelectorFromSet(labels.Set{nameLabel: providerName})},
			&corev1.Secret{}:     {Label: labels.NewSelector().Add(*hasCluster)},
		}},
	})
	if err != nil {
		return nil, err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	return mgr, nil
}
