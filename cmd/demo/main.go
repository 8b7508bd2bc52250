// Command demo runs karpenter-clusterapi on an embedded hub and spoke with
// simulated AWS (`make demo`): it starts the world of test/world, builds and
// runs the provider binary against it as main.go runs, applies
// examples/demo/, scales a workload up and down in a loop and shows what
// Karpenter and Cluster API do, every 2 s, until Ctrl-C (or SIGTERM), which
// stops every process it started.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/autonode/karpenter-clusterapi/test/environment"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == reaperFlag {
		runReaper(os.Stdin)
		return
	}
	dir := flag.String("dir", ".demo", "directory for the kubeconfigs, logs and the provider binary")
	refresh := flag.Duration("refresh", 2*time.Second, "how often the table is redrawn")
	withAutoNode := flag.Bool("autonode", false, "run the provider the AutoNode way: the AutoNode controller deploys it for the labelled Cluster (docs/autonode.md)")
	flag.Parse()

	// SIGINT (Ctrl-C), SIGTERM or SIGHUP (the terminal closed) stops the
	// demo and everything it started. A second one does not cut that short:
	// it would leave API servers running. Should the demo be killed outright
	// (SIGKILL), every process it started dies with it (Pdeathsig).
	ctx, cancel := context.WithCancel(context.Background())
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		<-signals
		cancel()
		for range signals {
			fmt.Fprintln(os.Stderr, "demo: stopping everything it started, a few seconds more")
		}
	}()
	if err := run(ctx, *dir, *refresh, *withAutoNode, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dir string, refresh time.Duration, withAutoNode bool, out io.Writer) (err error) {
	t0 := time.Now()
	say := func(format string, args ...any) {
		fmt.Fprintf(out, "[%5.1fs] %s\n", time.Since(t0).Seconds(), fmt.Sprintf(format, args...))
	}
	// An error caused by Ctrl-C during the start is a clean stop.
	interrupted := func(err error) error {
		if ctx.Err() != nil {
			say("interrupted during the start")
			return nil
		}
		return err
	}
	// The reaper stops what the demo started should the demo die without
	// doing it (SIGKILL): it watches every process group the demo's
	// children are in. Registered first, released last.
	r, err := startReaper()
	if err != nil {
		return err
	}
	defer r.release()
	watchCtx, stopWatching := context.WithCancel(context.Background())
	defer stopWatching()
	go r.watchDescendants(watchCtx, time.Second)

	root := environment.RepoRoot()
	if dir, err = filepath.Abs(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return err
	}
	if err := ensureEnvtestAssets(ctx, root, say); err != nil {
		return interrupted(err)
	}

	logFile, err := os.Create(filepath.Join(dir, "world.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	log := zap.New(zap.WriteTo(logFile), zap.UseDevMode(true))
	ctrl.SetLogger(log)

	say("starting the world: hub and spoke API servers, Cluster API, simulated AWS and kubelet, kube-scheduler, kube-controller-manager")
	say("building the provider binary (go build .) meanwhile")
	built := make(chan error, 1)
	bin := filepath.Join(dir, "bin", "karpenter-clusterapi")
	go func() { built <- buildProvider(ctx, root, bin) }()
	w, err := world.Start(ctx, world.Options{Logger: &log, ProvisionDelay: 3 * time.Second})
	if err != nil {
		<-built
		return interrupted(err)
	}
	defer func() {
		say("stopping the world (API servers, etcd, kube-scheduler, kube-controller-manager, controllers)")
		if stopErr := w.Stop(); stopErr != nil {
			err = errors.Join(err, fmt.Errorf("stopping the world: %w", stopErr))
			return
		}
		say("stopped everything the demo started")
	}()
	say("world up: hub %s, spoke %s", w.Hub.Config.Host, w.Spoke.Config.Host)
	kubeconfigs, err := copyKubeconfigs(w, dir)
	if err != nil {
		return err
	}
	if err := <-built; err != nil {
		return interrupted(err)
	}

	var p *provider
	if withAutoNode {
		p, err = startAutoNode(ctx, bin, w, dir, say)
	} else {
		p, err = startProvider(bin, w, filepath.Join(dir, "provider.log"))
	}
	if err != nil {
		return interrupted(err)
	}
	defer func() {
		say("stopping the provider (pid %d)", p.pid())
		p.stop()
	}()
	say("provider started: %s (log %s)", bin, p.logPath)

	if err := applyManifests(ctx, w, filepath.Join(root, "examples", "demo")); err != nil {
		return interrupted(err)
	}
	say("applied examples/demo/hub.yaml to the hub and examples/demo/workload.yaml to the spoke")

	d := &demo{w: w, p: p, events: newEventLog(t0), t0: t0, kubeconfigs: kubeconfigs, worldLog: logFile.Name()}
	fmt.Fprintf(out, "\n%s\n", d.usage())
	go d.scaleLoop(ctx)
	d.show(ctx, out, refresh)
	fmt.Fprintln(out)
	say("interrupted")
	return nil
}

// demo is the running demo: the world, the provider and what was seen.
type demo struct {
	w           *world.World
	p           *provider
	events      *eventLog
	latest      atomic.Pointer[snapshot]
	t0          time.Time
	kubeconfigs kubeconfigPaths
	worldLog    string
	// spotExhausted is what the scale loop last told the simulated AWS.
	spotExhausted bool
}

type kubeconfigPaths struct{ hub, spoke string }

// copyKubeconfigs writes the world's kubeconfigs to dir, for kubectl.
func copyKubeconfigs(w *world.World, dir string) (kubeconfigPaths, error) {
	paths := kubeconfigPaths{hub: filepath.Join(dir, "hub.kubeconfig"), spoke: filepath.Join(dir, "spoke.kubeconfig")}
	for src, dst := range map[string]string{w.HubKubeconfig: paths.hub, w.SpokeKubeconfig: paths.spoke} {
		data, err := os.ReadFile(src)
		if err != nil {
			return paths, err
		}
		if err := os.WriteFile(dst, data, 0o600); err != nil {
			return paths, err
		}
	}
	return paths, nil
}
