package e2eusers

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/autonode/karpenter-clusterapi/test/e2e"
	"github.com/autonode/karpenter-clusterapi/test/world"
)

var (
	w   *world.World
	bin string
	// providers started by the tests, checked for panics at the end.
	providers   []*e2e.Provider
	providersMu sync.Mutex
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctrl.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "e2eusers-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	built := make(chan error, 1)
	go func() {
		var err error
		bin, err = e2e.BuildProvider(dir)
		built <- err
	}()
	w, err = world.Start(ctx, world.Options{Published: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the world:", err)
		return 1
	}
	defer w.Stop()
	if err := <-built; err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	var logs []string
	for _, p := range providers {
		p.Stop()
		logs = append(logs, p.LogPath)
		if data, err := os.ReadFile(p.LogPath); err == nil && strings.Contains(string(data), "Observed a panic") && code == 0 {
			fmt.Fprintf(os.Stderr, "the provider panicked (\"Observed a panic\" in %s)\n", p.LogPath)
			code = 1
		}
	}
	if code != 0 {
		w.KeepDir = true
		fmt.Fprintf(os.Stderr, "logs: providers %v; world %v\n", logs, w.LogFiles())
	}
	return code
}
