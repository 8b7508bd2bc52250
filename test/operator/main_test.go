// Package operator_test runs the operator in-process, wired exactly as
// main.go wires it, against a real hub and a real spoke API server.
package operator_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"

	coreoperator "sigs.k8s.io/karpenter/pkg/operator"

	"github.com/autonode/karpenter-clusterapi/pkg/operator"
	"github.com/autonode/karpenter-clusterapi/pkg/operator/options"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

const (
	scopedNamespace = "team-a"
	scopedCluster   = "c1"
)

var hub, spoke *environment.Cluster

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if hub, err = environment.StartHub(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer hub.Stop()
	if spoke, err = environment.StartSpoke(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer spoke.Stop()
	dir, err := os.MkdirTemp("", "operator-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	hubKubeconfig, err := hub.WriteKubeconfig(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	spokeKubeconfig, err := spoke.WriteKubeconfig(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}

	// Karpenter core parses os.Args itself: hand it exactly what a user would.
	testArgs := os.Args
	os.Args = []string{"karpenter-clusterapi",
		"--kubeconfig=" + spokeKubeconfig,
		"--cluster-api-kubeconfig=" + hubKubeconfig,
		"--cluster-api-namespace=" + scopedNamespace,
		"--cluster-api-cluster-name=" + scopedCluster,
	}
	for k, v := range map[string]string{"DISABLE_LEADER_ELECTION": "true", "METRICS_PORT": "0", "HEALTH_PROBE_PORT": "0", "LOG_LEVEL": "error"} {
		os.Setenv(k, v)
	}
	if _, err := options.Preflight(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, core := coreoperator.NewOperator()
	os.Args = testArgs
	op, err := operator.NewOperator(ctx, core)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		op.Run(ctx)
	}()
	code := m.Run()
	cancel()
	<-done
	return code
}
