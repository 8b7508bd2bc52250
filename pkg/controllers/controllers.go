// Package controllers lists the provider's own controllers.
package controllers

import (
	"github.com/awslabs/operatorpkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeclassstatus "github.com/autonode/karpenter-clusterapi/pkg/controllers/nodeclass/status"
	"github.com/autonode/karpenter-clusterapi/pkg/hub"
	"github.com/autonode/karpenter-clusterapi/pkg/nodeclass"
)

// NewControllers returns the provider's controllers.
func NewControllers(kubeClient client.Client, h *hub.Hub) []controller.Controller {
	return []controller.Controller{
		nodeclassstatus.NewController(kubeClient, h, nodeclass.NewResolver(h)),
	}
}
