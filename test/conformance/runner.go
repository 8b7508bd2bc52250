package conformance

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Options of a conformance run.
type Options struct {
	Modes  []Mode
	Groups []Group
	// SuiteDir holds regression.test and disruption.test
	// (hack/conformance-bins.sh prints it).
	SuiteDir string
	// ProviderBin is the provider binary the karpenter pod runs.
	ProviderBin string
	// OutDir receives report.json, report.txt and each group's logs.
	OutDir string
	// EventuallyTimeout replaces the suites' 15-minute default (default 5m).
	EventuallyTimeout time.Duration
	// GroupTimeout bounds one group's suite process (default 3h).
	GroupTimeout time.Duration
	// Progress receives progress lines (which group, how many specs done,
	// elapsed); nil discards them.
	Progress io.Writer
	// Commit and KarpenterVersion are recorded in the report.
	Commit, KarpenterVersion string
	// Parallel is how many groups run at once (1 when zero), each in a
	// child process made by Child.
	Parallel int
	Child    ChildFunc
}

// Run runs the groups in every mode, one fresh world per group, and returns
// the report (also written to OutDir). ctx cancels the run; every process
// it started is stopped however it ends.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.EventuallyTimeout == 0 {
		o.EventuallyTimeout = 5 * time.Minute
	}
	if o.GroupTimeout == 0 {
		o.GroupTimeout = 3 * time.Hour
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return nil, err
	}
	r := &Report{Started: time.Now(), Commit: o.Commit, KarpenterVersion: o.KarpenterVersion, Modes: o.Modes}
	say := func(format string, args ...any) {
		fmt.Fprintf(o.Progress, "[%s] %s\n", fmtDuration(time.Since(r.Started)), fmt.Sprintf(format, args...))
	}
	jobs, err := plan(ctx, o)
	if err != nil {
		return nil, err
	}
	if o.Parallel > 1 {
		if o.Child == nil {
			return nil, fmt.Errorf("running %d groups at once needs Options.Child", o.Parallel)
		}
		return runParallel(ctx, o, r, jobs, say)
	}
	for _, j := range jobs {
		r.Specs = append(r.Specs, j.inapplicable...)
		if len(j.want) == 0 {
			continue
		}
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		prefix := fmt.Sprintf("%s mode (%d/%d), group %s (%d/%d)", j.mode, j.modeIndex+1, len(o.Modes), j.group.ID(), j.groupIndex+1, len(o.Groups))
		gr, results := runGroup(ctx, o, j.mode, j.group, j.want, func(format string, args ...any) { say(prefix+": "+format, args...) })
		r.Groups = append(r.Groups, gr)
		r.Specs = append(r.Specs, results...)
		s := summarize(results)
		say("%s: %d passed, %d failed, %d skipped in %s", prefix, s.Passed, s.Failed, s.Skipped, fmtDuration(time.Duration(gr.Seconds*float64(time.Second))))
		r.Summary = summarize(r.Specs)
		r.Seconds = time.Since(r.Started).Seconds()
		if err := r.WriteJSON(filepath.Join(o.OutDir, "report.json")); err != nil {
			return r, err
		}
	}
	return finish(r, o.OutDir)
}

// job is one group in one mode: the specs to run and those reported skipped
// as not applicable (the group's Skips include them).
type job struct {
	mode                  Mode
	modeIndex, groupIndex int
	group                 Group
	want                  []string
	inapplicable          []SpecResult
}

// plan lists every spec of both suites, checks that each belongs to exactly
// one group, and returns a job for each selected group in each of its modes,
// mode by mode in the groups' order.
func plan(ctx context.Context, o Options) ([]job, error) {
	specs := map[string][]string{}
	for _, suite := range Suites {
		list, err := listSpecs(ctx, filepath.Join(o.SuiteDir, suite+".test"), o.OutDir)
		if err != nil {
			return nil, err
		}
		specs[suite] = list
		if err := checkGrouping(suite, list); err != nil {
			return nil, err
		}
	}
	var jobs []job
	for mi, mode := range o.Modes {
		for gi, g := range o.Groups {
			if !g.RunsIn(mode) {
				continue
			}
			j := job{mode: mode, modeIndex: mi, groupIndex: gi}
			var skipped []string
			for _, text := range specs[g.Suite] {
				if !g.Matches(g.Suite, text) {
					continue
				}
				if reason, ok := notApplicable(g.Suite, text, mode); ok {
					skipped = append(skipped, "^"+regexp.QuoteMeta(text)+"$")
					j.inapplicable = append(j.inapplicable, SpecResult{Mode: mode, Suite: g.Suite, Group: g.Name, Spec: text, State: StateSkipped, Message: "not applicable: " + reason})
					continue
				}
				j.want = append(j.want, text)
			}
			g.Skips = append(append([]string(nil), g.Skips...), skipped...)
			j.group = g
			jobs = append(jobs, j)
		}
	}
	return jobs, nil
}

// finish writes the final report.json and report.txt.
func finish(r *Report, outDir string) (*Report, error) {
	r.Summary = summarize(r.Specs)
	r.Seconds = time.Since(r.Started).Seconds()
	if err := r.WriteJSON(filepath.Join(outDir, "report.json")); err != nil {
		return r, err
	}
	f, err := os.Create(filepath.Join(outDir, "report.txt"))
	if err != nil {
		return r, err
	}
	defer f.Close()
	r.WriteText(f)
	return r, nil
}

// runGroup runs one group in a fresh world and returns a result for every
// spec it was to run.
func runGroup(ctx context.Context, o Options, mode Mode, g Group, want []string, say func(string, ...any)) (GroupResult, []SpecResult) {
	t0 := time.Now()
	dir := filepath.Join(o.OutDir, string(mode), g.Suite, g.Name)
	gr := GroupResult{Mode: mode, Suite: g.Suite, Group: g.Name, Logs: dir}
	fail := func(err error) (GroupResult, []SpecResult) {
		gr.Error = err.Error()
		gr.Seconds = time.Since(t0).Seconds()
		var out []SpecResult
		for _, text := range want {
			out = append(out, SpecResult{Mode: mode, Suite: g.Suite, Group: g.Name, Spec: text, State: StateFailed, Message: "not run: " + err.Error()})
		}
		return gr, out
	}
	if err := os.RemoveAll(dir); err != nil {
		return fail(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail(err)
	}
	say("starting a world (hub, spoke, Cluster API, %s fleet, karpenter pod)", mode)
	// A world that does not start (an API server slow to come up on a
	// loaded machine) is tried again: no spec ran yet.
	var gw *groupWorld
	var err error
	for attempt := 1; attempt <= 3 && ctx.Err() == nil; attempt++ {
		startCtx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		gw, err = startGroupWorld(startCtx, mode, g, o.ProviderBin, dir)
		cancel()
		if err == nil {
			break
		}
		say("the world did not start (attempt %d of 3): %v", attempt, firstLine(err.Error()))
		if attempt < 3 {
			// The world keeps its directory for the logs of a failed start;
			// only the last attempt's are worth keeping.
			if m := keptWorldDir.FindStringSubmatch(err.Error()); m != nil {
				_ = os.RemoveAll(m[1])
			}
		}
	}
	if err != nil {
		return fail(fmt.Errorf("starting the world: %w", err))
	}
	gr.WorldSeconds = time.Since(t0).Seconds()
	say("world up in %s (%s); running %d specs", fmtDuration(time.Since(t0)), gw.w.Dir, len(want))
	reportPath := filepath.Join(dir, "ginkgo-report.json")
	runErr := runSuite(ctx, o, g, gw, dir, reportPath, len(want), say)
	results, missing := collect(mode, g, want, reportPath)
	keep := runErr != nil || hasFailure(results)
	if err := copyWorldLogs(gw, dir, keep); err != nil {
		say("copying the world's logs: %v", err)
	}
	if err := gw.stop(false); err != nil {
		say("stopping the world: %v", err)
	}
	gr.Seconds = time.Since(t0).Seconds()
	if runErr != nil {
		gr.Error = runErr.Error()
	}
	for _, text := range missing {
		msg := "the suite reported no result for this spec"
		if runErr != nil {
			msg += ": " + runErr.Error()
		}
		results = append(results, SpecResult{Mode: mode, Suite: g.Suite, Group: g.Name, Spec: text, State: StateFailed, Message: msg})
	}
	return gr, results
}

func hasFailure(rs []SpecResult) bool {
	for _, r := range rs {
		if r.State == StateFailed {
			return true
		}
	}
	return false
}

// specDone matches the line ginkgo -v prints when a spec ends:
// "• [1.234 seconds]", "• [FAILED] [1.234 seconds]", "S [SKIPPED] [0.001 seconds]".
var specDone = regexp.MustCompile(`^(•|S|P) (\[[A-Z]+\] )?\[[0-9.]+ seconds\]`)

// runSuite runs the group's specs with the suite binary against the world,
// in a process group of its own, killed however the run ends.
func runSuite(ctx context.Context, o Options, g Group, gw *groupWorld, dir, reportPath string, total int, say func(string, ...any)) error {
	args := []string{
		"-test.v", "-test.timeout=" + o.GroupTimeout.String(),
		"-ginkgo.v", "-ginkgo.no-color",
		"-ginkgo.focus=" + ginkgoFilter(g.Suite, g.Focus),
		"-ginkgo.json-report=" + reportPath,
		"-default-nodeclass=" + gw.nodeClassFile,
		"-default-nodepool=" + gw.nodePoolFile,
		"-repair-condition=" + RepairCondition,
	}
	if skip := ginkgoSkip(g); skip != "" {
		args = append(args, "-ginkgo.skip="+skip)
	}
	logFile, err := os.Create(filepath.Join(dir, "suite.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(filepath.Join(o.SuiteDir, g.Suite+".test"), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+gw.w.SpokeKubeconfig,
		"KARPENTER_E2E_EVENTUALLY_TIMEOUT="+o.EventuallyTimeout.String(),
		"OUTPUT_DIR="+dir,
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", cmd.Path, err)
	}
	var done atomic.Int32
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logFile, line)
			if specDone.MatchString(line) {
				say("%d/%d specs done", done.Add(1), total)
			}
		}
		_, _ = io.Copy(logFile, pr)
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); _ = pw.Close() }()
	t0 := time.Now()
	heartbeat := time.NewTicker(time.Minute)
	defer heartbeat.Stop()
	timeout := time.After(o.GroupTimeout + time.Minute)
	var runErr error
	for running := true; running; {
		select {
		case err := <-exited:
			running = false
			var exit *exec.ExitError
			if err != nil && !errors.As(err, &exit) {
				runErr = err
			}
		case <-heartbeat.C:
			say("%d/%d specs done, %s in the suite", done.Load(), total, fmtDuration(time.Since(t0)))
		case <-timeout:
			runErr = fmt.Errorf("the suite ran past %s and was killed", o.GroupTimeout)
			killGroup(cmd, exited)
			running = false
		case <-ctx.Done():
			runErr = fmt.Errorf("interrupted: %w", ctx.Err())
			killGroup(cmd, exited)
			running = false
		}
	}
	wg.Wait()
	return runErr
}

// suiteDescriptions are the suites' RunSpecs descriptions: ginkgo matches
// --focus and --skip against the description, a space and the spec's text.
var suiteDescriptions = map[string]string{"regression": "Regression", "disruption": "Disruption"}

// ginkgoFilter turns a regular expression over a spec's text into one over
// what ginkgo matches.
func ginkgoFilter(suite, expr string) string {
	if rest, ok := strings.CutPrefix(expr, "^"); ok {
		return "^" + regexp.QuoteMeta(suiteDescriptions[suite]) + " " + rest
	}
	return expr
}

// ginkgoSkip is the group's --ginkgo.skip: any of its Skips.
func ginkgoSkip(g Group) string {
	var alts []string
	for _, skip := range g.Skips {
		alts = append(alts, "("+ginkgoFilter(g.Suite, skip)+")")
	}
	return strings.Join(alts, "|")
}

// killGroup interrupts the suite (ginkgo then writes its report), and kills
// its process group if it does not exit.
func killGroup(cmd *exec.Cmd, exited chan error) {
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
}

// collect reads the group's ginkgo report into results, and returns the
// wanted specs it has no result for.
func collect(mode Mode, g Group, want []string, reportPath string) ([]SpecResult, []string) {
	specs, suiteFailures, err := readGinkgoReport(reportPath)
	if err != nil {
		return nil, want
	}
	byText := map[string]ginkgoSpec{}
	for _, s := range specs {
		byText[s.Text] = s
	}
	var out []SpecResult
	var missing []string
	for _, text := range want {
		s, ok := byText[text]
		if !ok {
			missing = append(missing, text)
			continue
		}
		msg := s.Message
		state := normalizeState(s.State)
		if state == StateSkipped && msg == "" && len(suiteFailures) > 0 {
			// Ginkgo skips every spec after a BeforeSuite failure.
			state, msg = StateFailed, suiteFailures[0]
		}
		out = append(out, SpecResult{
			Mode: mode, Suite: g.Suite, Group: g.Name, Spec: text, State: state,
			Seconds: s.RunTime.Seconds(), Message: msg, Location: s.Location,
		})
	}
	return out, missing
}

// listSpecs lists a suite's specs (ginkgo --dry-run: nothing runs, no
// cluster needed).
func listSpecs(ctx context.Context, bin, dir string) ([]string, error) {
	report := filepath.Join(dir, filepath.Base(bin)+".specs.json")
	cmd := exec.CommandContext(ctx, bin, "-ginkgo.dry-run", "-ginkgo.no-color", "-ginkgo.json-report="+report)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("listing the specs of %s: %w: %s", bin, err, lastLines(string(out), 20))
	}
	defer os.Remove(report)
	specs, _, err := readGinkgoReport(report)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(specs))
	for _, s := range specs {
		out = append(out, s.Text)
	}
	return out, nil
}

// checkGrouping fails when a spec of the suite belongs to no group or to
// several: a new upstream spec must not go unrun unnoticed.
func checkGrouping(suite string, specs []string) error {
	var errs []error
	for _, text := range specs {
		n := 0
		for _, g := range Groups {
			if g.Matches(suite, text) {
				n++
			}
		}
		if n != 1 {
			errs = append(errs, fmt.Errorf("spec %q of %s is in %d groups (want 1): update test/conformance/groups.go", text, suite, n))
		}
	}
	return errors.Join(errs...)
}

// keptWorldDir finds the directory a world that failed to start kept.
var keptWorldDir = regexp.MustCompile(`logs in (/\S*world-[0-9]+)\)`)

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

func fmtDuration(d time.Duration) string {
	return d.Round(time.Second).String()
}

func lastLines(s string, n int) string {
	lines := regexp.MustCompile("\r?\n").Split(s, -1)
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	out := ""
	for _, l := range lines {
		out += l + "\n"
	}
	return out
}
