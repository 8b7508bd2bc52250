// Command karpenter-clusterapi runs Karpenter with Cluster API as its cloud.
package main

import (
	"context"
	"fmt"
	"os"

	coreoperator "sigs.k8s.io/karpenter/pkg/operator"

	"github.com/autonode/karpenter-clusterapi/pkg/operator"
	"github.com/autonode/karpenter-clusterapi/pkg/operator/options"
)

func main() {
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
	op, err := operator.NewOperator(ctx, core)
	if err != nil {
		fmt.Fprintf(os.Stderr, "karpenter-clusterapi: %v\n", err)
		os.Exit(1)
	}
	op.Run(ctx)
}
