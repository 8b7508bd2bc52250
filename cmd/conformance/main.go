// Command conformance runs Karpenter's own end-to-end suites against this
// provider in both modes (`make conformance`): one fresh world of test/world
// per group of specs, the provider running as the karpenter Deployment's pod.
// It prints progress while it runs, then every spec's result and the line
// "conformance: P passed, F failed, S skipped"; report.json and report.txt
// and each group's logs are written to -out. It exits 1 when a spec failed.
//
// KUBEBUILDER_ASSETS must name the envtest binaries (hack/envtest-bins.sh)
// and -suites the suite binaries (hack/conformance-bins.sh); the Makefile
// target passes both.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/autonode/karpenter-clusterapi/test/conformance"
	"github.com/autonode/karpenter-clusterapi/test/environment"
)

func main() {
	modes := flag.String("modes", "machinedeployment,machine", "modes to run, comma-separated")
	groups := flag.String("groups", "", "regular expression over group IDs (suite/name); all groups when empty")
	ci := flag.Bool("ci", false, "only the groups and specs `make test` runs (CI groups without their CI-skipped specs)")
	out := flag.String("out", ".conformance", "directory for report.json, report.txt and the groups' logs")
	suites := flag.String("suites", os.Getenv("CONFORMANCE_SUITES"), "directory of regression.test and disruption.test (hack/conformance-bins.sh)")
	eventually := flag.Duration("eventually-timeout", 5*time.Minute, "the suites' default Eventually timeout (15m upstream, sized for real clouds)")
	groupTimeout := flag.Duration("group-timeout", 3*time.Hour, "how long one group's suite may run")
	list := flag.Bool("list", false, "list the groups and exit")
	parallel := flag.Int("parallel", 1, "how many groups run at once, each with a world and a runner process of its own")
	providerBin := flag.String("provider-bin", "", "the provider binary the karpenter pod runs (built from the repository when empty)")
	flag.Parse()

	// The worlds log to files; keep controller-runtime's global logger quiet.
	ctrl.SetLogger(logr.Discard())
	if *list {
		for _, g := range conformance.Groups {
			fmt.Printf("%-45s ci=%t focus=%q\n", g.ID(), g.CI, g.Focus)
		}
		return
	}
	o := runOptions{modes: *modes, groups: *groups, ci: *ci, out: *out, suites: *suites, eventually: *eventually,
		groupTimeout: *groupTimeout, parallel: *parallel, providerBin: *providerBin}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(1)
	}
}

// runOptions are the command's flags.
type runOptions struct {
	modes, groups, out, suites, providerBin string
	ci                                      bool
	eventually, groupTimeout                time.Duration
	parallel                                int
}

func run(o runOptions) error {
	groupExpr, ci, out, suites := o.groups, o.ci, o.out, o.suites
	var modes []conformance.Mode
	for _, s := range strings.Split(o.modes, ",") {
		m, err := conformance.ParseMode(strings.TrimSpace(s))
		if err != nil {
			return err
		}
		modes = append(modes, m)
	}
	groups, err := conformance.SelectGroups(groupExpr, ci)
	if err != nil {
		return err
	}
	if ci {
		// What `make test` runs: without the CI-skipped specs either.
		for i := range groups {
			if groups[i].CISkip != "" {
				groups[i].Skips = append(groups[i].Skips, groups[i].CISkip)
			}
		}
	}
	if suites == "" {
		return fmt.Errorf("-suites (or CONFORMANCE_SUITES) must name the suite binaries' directory: run hack/conformance-bins.sh")
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return fmt.Errorf("KUBEBUILDER_ASSETS must name the envtest binaries: run hack/envtest-bins.sh")
	}
	if out, err = filepath.Abs(out); err != nil {
		return err
	}
	// SIGINT or SIGTERM stops the run and everything it started; a second one
	// does not cut that short (it would leave API servers running).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-signals
		fmt.Fprintln(os.Stderr, "conformance: interrupted, stopping the suite, the provider and the world")
		cancel()
		for range signals {
			fmt.Fprintln(os.Stderr, "conformance: still stopping everything it started")
		}
	}()

	root := environment.RepoRoot()
	if err := os.MkdirAll(filepath.Join(out, "bin"), 0o755); err != nil {
		return err
	}
	provider := o.providerBin
	if provider == "" {
		provider = filepath.Join(out, "bin", "karpenter-clusterapi")
		fmt.Println("conformance: building the provider (go build .)")
		build := exec.CommandContext(ctx, "go", "build", "-o", provider, ".")
		build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
		if b, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("building the provider: %w: %s", err, b)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	// A group run at once with others runs in a child: this command for
	// that group and mode alone, with the provider built here.
	child := func(mode conformance.Mode, g conformance.Group, dir string) *exec.Cmd {
		args := []string{"-modes", string(mode), "-groups", "^" + regexp.QuoteMeta(g.ID()) + "$", "-out", dir,
			"-suites", suites, "-eventually-timeout", o.eventually.String(), "-group-timeout", o.groupTimeout.String(),
			"-provider-bin", provider}
		if ci {
			args = append(args, "-ci")
		}
		cmd := exec.Command(self, args...)
		cmd.Dir = root
		return cmd
	}
	r, err := conformance.Run(ctx, conformance.Options{
		Modes: modes, Groups: groups, SuiteDir: suites, ProviderBin: provider, OutDir: out,
		EventuallyTimeout: o.eventually, GroupTimeout: o.groupTimeout, Progress: os.Stdout,
		Commit: gitOutput(root, "rev-parse", "--short", "HEAD") + dirty(root), KarpenterVersion: karpenterVersion(root),
		Parallel: o.parallel, Child: child,
	})
	if r != nil {
		fmt.Println()
		r.WriteText(os.Stdout)
		fmt.Printf("report: %s\n", filepath.Join(out, "report.json"))
	}
	if err != nil {
		return err
	}
	if r.Summary.Failed > 0 {
		return fmt.Errorf("%d specs failed", r.Summary.Failed)
	}
	return nil
}

func gitOutput(dir string, args ...string) string {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	b, err := cmd.Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

func dirty(dir string) string {
	if gitOutput(dir, "status", "--porcelain", "--untracked-files=no") != "" {
		return "+dirty"
	}
	return ""
}

func karpenterVersion(dir string) string {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "sigs.k8s.io/karpenter")
	cmd.Dir = dir
	b, err := cmd.Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}
