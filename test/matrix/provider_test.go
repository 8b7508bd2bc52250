package matrix

import (
	"context"
	"fmt"
	"time"

	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/autonode/karpenter-clusterapi/pkg/cloudprovider"
	"github.com/autonode/karpenter-clusterapi/pkg/controllers"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/launch"
	"github.com/autonode/karpenter-clusterapi/pkg/machine"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
)

// startProvider assembles the cloud provider and the provider's own
// controllers as pkg/operator's Run does (without Karpenter core: the test
// calls GetInstanceTypes and Create itself), for one Cluster of the world,
// against that Cluster's workload cluster. It runs until ctx ends. The
// reader is the provider's cache of the workload cluster, the view core
// would decide on.
func startProvider(ctx context.Context, hubConfig, spokeConfig *rest.Config, namespace, cluster string) (*cloudprovider.CloudProvider, client.Reader, error) {
	mgr, err := ctrl.NewManager(rest.CopyConfig(spokeConfig), ctrl.Options{
		Scheme:                 scheme.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return nil, nil, err
	}
	h, err := hub.New(rest.CopyConfig(hubConfig), scheme.Scheme, hub.Scope{Namespace: namespace, ClusterName: cluster})
	if err != nil {
		return nil, nil, err
	}
	if err := h.SetupIndexes(ctx); err != nil {
		return nil, nil, err
	}
	if err := mgr.Add(h); err != nil {
		return nil, nil, err
	}
	store := instancetype.NewStore()
	managed, err := h.NewManagedMachines(ctx)
	if err != nil {
		return nil, nil, err
	}
	unavailable := launch.NewUnavailable(time.Minute, store.Notify)
	md := machinedeployment.NewProvider(h, managed, store, unavailable)
	catalogue, err := machine.NewCatalogue(ctx, h, unavailable, store.Notify)
	if err != nil {
		return nil, nil, err
	}
	zones := instancetype.NewZones()
	store.UseZones(zones)
	catalogue.UseZones(zones)
	machines := hub.NewLookup(h, managed)
	mm, err := machine.NewProvider(ctx, h, machines, catalogue)
	if err != nil {
		return nil, nil, err
	}
	cp := cloudprovider.New(mgr.GetClient(), managed, machines, md.Mode(), mm.Mode())
	cp.ReadLiveWith(mgr.GetAPIReader())
	for _, c := range controllers.NewControllers(mgr.GetClient(), mgr.GetAPIReader(), h, store, md, mm, machines, zones, false) {
		if err := c.Register(ctx, mgr); err != nil {
			return nil, nil, fmt.Errorf("registering %T: %w", c, err)
		}
	}
	go func() { _ = mgr.Start(ctx) }()
	if !mgr.GetCache().WaitForCacheSync(ctx) || !h.GetCache().WaitForCacheSync(ctx) {
		return nil, nil, fmt.Errorf("caches of Cluster %s did not sync", cluster)
	}
	return cp, mgr.GetClient(), nil
}
