package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/autonode/karpenter-clusterapi/pkg/autonode"
	"github.com/autonode/karpenter-clusterapi/test/autonoderun"
	"github.com/autonode/karpenter-clusterapi/test/podrun"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

// startAutoNode runs the provider the AutoNode way (--autonode): the
// AutoNode controller under its packaged RBAC, the Cluster labelled
// karpenter.cluster.x-k8s.io/autonode=enabled, and the provider Deployment
// it creates run as a kubelet would (test/podrun). It returns the
// provider's process once AutoNode reports it Running.
func startAutoNode(ctx context.Context, bin string, w *world.World, dir string, say func(string, ...any)) (*provider, error) {
	kubeconfig, err := autonoderun.Install(ctx, w.Hub.Client, w.Hub.Config, dir)
	if err != nil {
		return nil, err
	}
	metrics, err := freePort()
	if err != nil {
		return nil, err
	}
	controller, err := autonoderun.StartController(bin, kubeconfig, "demo", fmt.Sprintf("127.0.0.1:%d", metrics), filepath.Join(dir, "autonode.log"))
	if err != nil {
		return nil, err
	}
	runner, err := autonoderun.StartPods(w.Hub.Config, bin, filepath.Join(dir, "autonode-pods"))
	if err != nil {
		controller.Stop()
		return nil, err
	}
	stopAll := func() { runner.Stop(); controller.Stop() }
	say("AutoNode controller started (log %s); labelling Cluster %s/%s %s=%s", filepath.Join(dir, "autonode.log"), w.Namespace, w.ClusterName, autonode.EnabledLabel, autonode.Enabled)
	if err := label(ctx, w); err != nil {
		stopAll()
		return nil, err
	}
	key := client.ObjectKey{Namespace: w.Namespace, Name: w.ClusterName + "-karpenter"}
	var proc *podrun.Process
	var message string
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		c := &clusterv1.Cluster{}
		if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: w.Namespace, Name: w.ClusterName}, c); err != nil {
			return false, nil //nolint:nilerr // retried
		}
		for _, cond := range c.Status.Conditions {
			if cond.Type == autonode.ConditionType {
				message = cond.Reason + ": " + cond.Message
				if procs := runner.Processes(key); cond.Reason == autonode.ReasonRunning && len(procs) > 0 {
					proc = procs[0]
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		stopAll()
		return nil, fmt.Errorf("waiting for AutoNode to run the provider (last: %s): %w", message, err)
	}
	say("AutoNode: %s", message)
	return newProviderOf(proc.Pid(), proc.LogPath, proc.MetricsPort, proc.Done(), stopAll), nil
}

func label(ctx context.Context, w *world.World) error {
	c := &clusterv1.Cluster{}
	if err := w.Hub.Client.Get(ctx, client.ObjectKey{Namespace: w.Namespace, Name: w.ClusterName}, c); err != nil {
		return err
	}
	patch := client.MergeFrom(c.DeepCopy())
	if c.Labels == nil {
		c.Labels = map[string]string{}
	}
	c.Labels[autonode.EnabledLabel] = autonode.Enabled
	return w.Hub.Client.Patch(ctx, c, patch)
}
