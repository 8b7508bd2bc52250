// Package operator wires this provider into Karpenter core's operator: the
// second cluster (the hub), the cloud provider and the controllers. main.go
// and the end-to-end tests both start the product through Run.
package operator

import (
	"context"
	"fmt"
	"time"

	"github.com/samber/lo"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/karpenter/pkg/cloudprovider/overlay"
	corecontrollers "sigs.k8s.io/karpenter/pkg/controllers"
	"sigs.k8s.io/karpenter/pkg/controllers/node/health"
	"sigs.k8s.io/karpenter/pkg/controllers/provisioning"
	"sigs.k8s.io/karpenter/pkg/controllers/state"
	coreoperator "sigs.k8s.io/karpenter/pkg/operator"
	coreoptions "sigs.k8s.io/karpenter/pkg/operator/options"

	_ "github.com/autonode/karpenter-clusterapi/pkg/apis" // registers the types in core's scheme
	"github.com/autonode/karpenter-clusterapi/pkg/cloudprovider"
	"github.com/autonode/karpenter-clusterapi/pkg/controllers"
	"github.com/autonode/karpenter-clusterapi/pkg/controllers/bufferpass"
	overlaycontroller "github.com/autonode/karpenter-clusterapi/pkg/controllers/overlay"
	"github.com/autonode/karpenter-clusterapi/pkg/csrapproval"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/launch"
	"github.com/autonode/karpenter-clusterapi/pkg/machine"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
	"github.com/autonode/karpenter-clusterapi/pkg/operator/leader"
	"github.com/autonode/karpenter-clusterapi/pkg/operator/options"
)

// hubCheckTimeout bounds the start-up check of the management cluster.
const hubCheckTimeout = 15 * time.Second

// Operator is Karpenter core's operator plus the management cluster.
type Operator struct {
	*coreoperator.Operator
	Hub *hub.Hub
}

// CheckClusters checks that the workload and management clusters are
// reachable before Karpenter core starts (core panics on an unreachable
// cluster). Errors name the flag to fix.
func CheckClusters(ctx context.Context, opts *options.Options) error {
	spokeCfg, err := ctrlconfig.GetConfig()
	if err != nil {
		return fmt.Errorf("--%s (KUBECONFIG, or the in-cluster config): %w", options.FlagKubeconfig, err)
	}
	if err := hub.CheckReachable(ctx, spokeCfg, hubCheckTimeout); err != nil {
		return fmt.Errorf("--%s: workload cluster at %s is not reachable: %w", options.FlagKubeconfig, spokeCfg.Host, err)
	}
	hubCfg, flagName, err := hubConfig(opts, spokeCfg)
	if err != nil {
		return err
	}
	if err := hub.CheckReachable(ctx, hubCfg, hubCheckTimeout); err != nil {
		return fmt.Errorf("--%s: management cluster at %s is not reachable: %w", flagName, hubCfg.Host, err)
	}
	return nil
}

// NewOperator connects to the management cluster named by the options and
// checks that it serves Cluster API. Errors name the flag.
func NewOperator(ctx context.Context, core *coreoperator.Operator) (*Operator, error) {
	opts := options.FromContext(ctx)
	if opts == nil {
		return nil, fmt.Errorf("provider options are missing from the context")
	}
	// Before anything is added to the manager: leader-only runnables are
	// gated as they are added.
	mgr, err := leader.Wrap(core.Manager, opts.LeaderElection)
	if err != nil {
		return nil, err
	}
	core.Manager = mgr
	hubCfg, flagName, err := hubConfig(opts, core.GetConfig())
	if err != nil {
		return nil, err
	}
	scope, err := discoverScope(ctx, hubCfg, hub.Scope{Namespace: opts.ClusterAPINamespace, ClusterName: opts.ClusterAPIClusterName})
	if err != nil {
		return nil, err
	}
	h, err := hub.New(hubCfg, scheme.Scheme, scope)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flagName, err)
	}
	gvk, err := apiutil.GVKForObject(&clusterv1.MachineDeployment{}, scheme.Scheme)
	if err != nil {
		return nil, err
	}
	if _, err := h.GetRESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
		if meta.IsNoMatchError(err) {
			return nil, fmt.Errorf("--%s: management cluster at %s does not serve Cluster API %s (are the Cluster API CRDs installed?)", flagName, hubCfg.Host, gvk.GroupVersion())
		}
		return nil, fmt.Errorf("--%s: discovering Cluster API on %s: %w", flagName, hubCfg.Host, err)
	}
	if err := h.SetupIndexes(ctx); err != nil {
		return nil, err
	}
	if err := core.Add(h); err != nil {
		return nil, fmt.Errorf("adding the management cluster cache: %w", err)
	}
	return &Operator{Operator: core, Hub: h}, nil
}

func hubConfig(opts *options.Options, spoke *rest.Config) (*rest.Config, string, error) {
	if opts.ClusterAPIKubeconfig == "" {
		return rest.CopyConfig(spoke), options.FlagKubeconfig + " (the management cluster defaults to the workload cluster)", nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", opts.ClusterAPIKubeconfig)
	if err != nil {
		return nil, options.FlagClusterAPIKubeconfig, fmt.Errorf("--%s: %w", options.FlagClusterAPIKubeconfig, err)
	}
	cfg.QPS = spoke.QPS
	cfg.Burst = spoke.Burst
	cfg.UserAgent = spoke.UserAgent
	return cfg, options.FlagClusterAPIKubeconfig, nil
}

// Run wires core's controllers with this provider and the provider's own
// controllers, then runs until ctx ends. It is what main.go runs.
func (o *Operator) Run(ctx context.Context) {
	store := instancetype.NewStore()
	managed := lo.Must(o.Hub.NewManagedMachines(ctx))
	ttl := options.DefaultUnavailableTTL
	if opts := options.FromContext(ctx); opts != nil && opts.UnavailableTTL > 0 {
		ttl = opts.UnavailableTTL
	}
	// One cache of exhausted offerings for both modes.
	unavailable := launch.NewUnavailable(ttl, store.Notify)
	mdProvider := machinedeployment.NewProvider(o.Hub, managed, store, unavailable)
	catalogue := lo.Must(machine.NewCatalogue(ctx, o.Hub, unavailable, store.Notify))
	// The zones nodes registered in: offerings in no particular zone get a
	// price record there (instancetype.Zones).
	zones := instancetype.NewZones()
	store.UseZones(zones)
	catalogue.UseZones(zones)
	machines := hub.NewLookup(o.Hub, managed)
	mProvider := lo.Must(machine.NewProvider(ctx, o.Hub, machines, catalogue))
	undecorated := cloudprovider.New(o.GetClient(), managed, machines, mdProvider.Mode(), mProvider.Mode())
	undecorated.WaitForHubWith(o.Hub.Reachability.Wait)
	undecorated.ReadLiveWith(o.GetAPIReader())
	undecorated.RecordEventsWith(o.EventRecorder)
	if opts := options.FromContext(ctx); opts != nil {
		undecorated.RepairAlso(opts.RepairConditions)
	}
	cloudProvider := overlay.Decorate(undecorated, o.GetClient(), o.InstanceTypeStore)
	undecorated.UsePricesFrom(cloudProvider)
	repairPolicyMatcher := lo.Must(health.NewRepairPolicyMatcher(ctx, cloudProvider))
	clusterState := state.NewCluster(o.Clock, o.GetClient(), cloudProvider, state.WithRepairPolicyMatcher(repairPolicyMatcher))
	log.FromContext(ctx).WithValues("namespace", o.Hub.Scope.Namespace, "cluster", o.Hub.Scope.ClusterName).Info("starting Cluster API provider")
	coreControllers := corecontrollers.NewControllers(
		ctx,
		o.Manager,
		o.Clock,
		o.GetClient(),
		o.EventRecorder,
		cloudProvider,
		undecorated,
		clusterState,
		o.InstanceTypeStore,
		o.PredictionStore,
	)
	// Instance types come and go with the hub's MachineDeployments and
	// templates: NodeOverlays are re-evaluated on each change.
	coreControllers = overlaycontroller.Replace(coreControllers, o.GetClient(), undecorated.GetSupportedNodeClasses(), store.Subscribe())
	if coreopts := coreoptions.FromContext(ctx); coreopts != nil && coreopts.FeatureGates.CapacityBuffer {
		// Buffer capacity on a node that is up within seconds of its
		// launch is counted at once (pkg/controllers/bufferpass).
		for _, c := range coreControllers {
			if p, ok := c.(*provisioning.Provisioner); ok {
				coreControllers = append(coreControllers, bufferpass.NewController(p.TriggerReconcile))
				break
			}
		}
	}
	nodeRepair := false
	if coreopts := coreoptions.FromContext(ctx); coreopts != nil {
		nodeRepair = coreopts.FeatureGates.NodeRepair
	}
	own := controllers.NewControllers(o.GetClient(), o.GetAPIReader(), o.Hub, store, mdProvider, mProvider, machines, zones, nodeRepair)
	if opts := options.FromContext(ctx); opts != nil && opts.ApproveKubeletCSRs {
		log.FromContext(ctx).Info("approving the kubelet certificate requests of this provider's nodes")
		own = append(own, csrapproval.NewController(o.GetClient(), o.GetAPIReader(), o.Hub, machines, csrapproval.Policy{
			BootstrapServiceAccounts: opts.KubeletCSRBootstrapServiceAccounts,
			SubjectAccessReview:      opts.KubeletCSRBootstrapAuthorization == options.KubeletCSRAuthorizationSAR,
			ServingExternalAddresses: opts.KubeletCSRServingExternalAddresses,
		}))
	}
	o.WithControllers(ctx, coreControllers...).
		WithControllers(ctx, own...).
		Start(ctx)
}
