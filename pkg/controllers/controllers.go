// Package controllers lists the provider's own controllers.
package controllers

import (
	"github.com/awslabs/operatorpkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/controllers/allocatable"
	"github.com/autonode/karpenter-clusterapi/pkg/controllers/coexistence"
	"github.com/autonode/karpenter-clusterapi/pkg/controllers/machinegone"
	nodeclassstatus "github.com/autonode/karpenter-clusterapi/pkg/controllers/nodeclass/status"
	"github.com/autonode/karpenter-clusterapi/pkg/controllers/remediation"
	"github.com/autonode/karpenter-clusterapi/pkg/controllers/zone"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/instancetype"
	"github.com/autonode/karpenter-clusterapi/pkg/machine"
	"github.com/autonode/karpenter-clusterapi/pkg/machinedeployment"
	"github.com/autonode/karpenter-clusterapi/pkg/nodeclass"
)

// NewControllers returns the provider's controllers. kubeClient and
// kubeAPIReader are the workload cluster's cached client and live reader;
// nodeRepair is whether Karpenter's NodeRepair feature gate is on.
func NewControllers(kubeClient client.Client, kubeAPIReader client.Reader, h *hub.Hub, store *instancetype.Store,
	md *machinedeployment.Provider, mm *machine.Provider, machines *hub.Lookup, zones *instancetype.Zones, nodeRepair bool) []controller.Controller {
	return []controller.Controller{
		nodeclassstatus.NewController(kubeClient, h, nodeclass.NewResolver(h, store, mm.Catalogue()), store.Subscribe()),
		machinedeployment.NewController(md, kubeClient, kubeAPIReader),
		machine.NewGarbageCollector(mm, kubeClient, kubeAPIReader),
		allocatable.NewController(kubeClient),
		zone.NewController(kubeClient, zones),
		machinegone.NewController(kubeClient, h, machines),
		coexistence.NewController(kubeClient, h),
		remediation.NewController(h, nodeRepair),
	}
}
