package operator

import (
	"context"
	"fmt"

	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/autonode/karpenter-clusterapi/pkg/operator/crds"
	"github.com/autonode/karpenter-clusterapi/pkg/operator/options"
)

// InstallWorkloadCRDs installs or updates the Karpenter and NodeClass CRDs in
// the workload cluster when --install-workload-crds is set. main.go calls it
// before Karpenter core's operator starts informers on those kinds.
func InstallWorkloadCRDs(ctx context.Context, opts *options.Options) error {
	if !opts.InstallWorkloadCRDs {
		return nil
	}
	cfg, err := ctrlconfig.GetConfig()
	if err != nil {
		return fmt.Errorf("--%s (KUBECONFIG, or the in-cluster config): %w", options.FlagKubeconfig, err)
	}
	if err := crds.Install(ctx, cfg); err != nil {
		return fmt.Errorf("--%s (INSTALL_WORKLOAD_CRDS): workload cluster at %s: %w", options.FlagInstallWorkloadCRDs, cfg.Host, err)
	}
	return nil
}
