// Command karpenter-clusterapi runs Karpenter with Cluster API as its cloud.
package main

import (
	"context"
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	coreoperator "sigs.k8s.io/karpenter/pkg/operator"

	"github.com/autonode/karpenter-clusterapi/pkg/autonode"
	"github.com/autonode/karpenter-clusterapi/pkg/caconvert"
	"github.com/autonode/karpenter-clusterapi/pkg/operator"
	"github.com/autonode/karpenter-clusterapi/pkg/operator/options"
)

func main() {
	// Subcommands first: core's flag parsing below would refuse their flags.
	if len(os.Args) > 1 && os.Args[1] == caconvert.Command {
		os.Exit(caconvert.Main(context.Background(), os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == autonode.Command {
		os.Exit(autonode.Main(context.Background(), os.Args[2:], os.Stderr))
	}
	opts, err := options.Preflight(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "karpenter-clusterapi: %v\n", err)
		os.Exit(2)
	}
	if opts != nil {
		if err := operator.CheckClusters(context.Background(), opts); err != nil {
			fmt.Fprintf(os.Stderr, "karpenter-clusterapi: %v\n", err)
			os.Exit(1)
		}
		// Before core's operator: its informers need these kinds to exist.
		if err := operator.InstallWorkloadCRDs(context.Background(), opts); err != nil {
			fmt.Fprintf(os.Stderr, "karpenter-clusterapi: %v\n", err)
			os.Exit(1)
		}
	}
	ctx, core := coreoperator.NewOperator()
	// Core's operator never stops on its own: its context is Background and
	// it installs no signal handler, so SIGTERM (a rolling update, a drain)
	// killed the process on the spot, and the leader's Lease stayed taken
	// until it ran out. Stop gracefully instead: the controllers stop, then
	// the Lease is released and a standby leads at once. A second signal
	// exits at once.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		<-ctrl.SetupSignalHandler().Done()
		stop()
	}()
	op, err := operator.NewOperator(ctx, core)
	if err != nil {
		fmt.Fprintf(os.Stderr, "karpenter-clusterapi: %v\n", err)
		os.Exit(1)
	}
	op.Run(ctx)
}
