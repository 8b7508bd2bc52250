package conformance

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ChildFunc returns the command that runs one group in one mode as a
// conformance run of its own (cmd/conformance with -modes, -groups and -out
// naming just that), writing its report.json to outDir.
type ChildFunc func(mode Mode, g Group, outDir string) *exec.Cmd

// runParallel runs the jobs as child processes, at most o.Parallel at once.
// A world runs Cluster API's reconcilers in its process, whose controller
// names and metrics are process-wide, so each concurrent world needs a
// process of its own. The longest groups (Group.Minutes) start first, so the
// run ends soon after its longest group; the report keeps the jobs' order
// whatever order they end in.
func runParallel(ctx context.Context, o Options, r *Report, jobs []job, say func(string, ...any)) (*Report, error) {
	order := make([]int, 0, len(jobs))
	for i, j := range jobs {
		if len(j.want) > 0 {
			order = append(order, i)
		}
	}
	// Groups that run alone go last, so the others share the machine
	// first; groups that take several slots go first, while the slots are
	// free (later they would wait for several to come free at once); among
	// each, the longest first.
	sort.SliceStable(order, func(a, b int) bool {
		ga, gb := jobs[order[a]].group, jobs[order[b]].group
		if ga.Alone != gb.Alone {
			return gb.Alone
		}
		if sa, sb := max(ga.Slots, 1), max(gb.Slots, 1); sa != sb {
			return sa > sb
		}
		return ga.Minutes > gb.Minutes
	})

	type outcome struct {
		groups []GroupResult
		specs  []SpecResult
	}
	outcomes := make([]*outcome, len(jobs))
	var mu sync.Mutex
	// merge rebuilds the report from the jobs ended so far, in job order.
	merge := func() {
		r.Groups, r.Specs = nil, nil
		for i, j := range jobs {
			switch {
			case len(j.want) == 0:
				r.Specs = append(r.Specs, j.inapplicable...)
			case outcomes[i] != nil:
				r.Groups = append(r.Groups, outcomes[i].groups...)
				r.Specs = append(r.Specs, outcomes[i].specs...)
			}
		}
		r.Summary = summarize(r.Specs)
		r.Seconds = time.Since(r.Started).Seconds()
	}

	sched := newScheduler(ctx, o.Parallel)
	var wg sync.WaitGroup
	started := 0
	pending := order
	for len(pending) > 0 {
		k, ok := sched.take(pending, jobs)
		if !ok {
			break // cancelled
		}
		i := pending[k]
		pending = append(pending[:k:k], pending[k+1:]...)
		j := jobs[i]
		started++
		prefix := fmt.Sprintf("[job %d/%d] %s mode, group %s", started, len(order), j.mode, j.group.ID())
		// Worlds start one at a time: an API server starting beside five
		// others on 2 cores missed envtest's start timeout.
		up := make(chan struct{})
		var once sync.Once
		worldUp := func() { once.Do(func() { close(up) }) }
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer sched.release(j.group)
			defer worldUp()
			groups, specs := runChild(ctx, o, j, worldUp, func(format string, args ...any) { say(prefix+": "+format, args...) })
			s := summarize(specs)
			var secs float64
			for _, g := range groups {
				secs += g.Seconds
			}
			say("%s: %d passed, %d failed, %d skipped in %s", prefix, s.Passed, s.Failed, s.Skipped, fmtDuration(time.Duration(secs*float64(time.Second))))
			mu.Lock()
			defer mu.Unlock()
			outcomes[i] = &outcome{groups: groups, specs: specs}
			merge()
			if err := r.WriteJSON(filepath.Join(o.OutDir, "report.json")); err != nil {
				say("writing the report: %v", err)
			}
		}()
		select {
		case <-up:
		case <-ctx.Done():
		}
	}
	wg.Wait()
	merge()
	if ctx.Err() != nil {
		_, _ = finish(r, o.OutDir)
		return r, ctx.Err()
	}
	return finish(r, o.OutDir)
}

// scheduler hands out a parallel run's slots. A group takes one slot, or
// every slot when it runs alone, and none while a running group holds one of
// its host ports.
type scheduler struct {
	mu    sync.Mutex
	cond  *sync.Cond
	ctx   context.Context
	slots int
	free  int
	ports map[int]bool
}

func newScheduler(ctx context.Context, slots int) *scheduler {
	s := &scheduler{ctx: ctx, slots: slots, free: slots, ports: map[int]bool{}}
	s.cond = sync.NewCond(&s.mu)
	go func() {
		<-ctx.Done()
		s.mu.Lock()
		defer s.mu.Unlock()
		s.cond.Broadcast()
	}()
	return s
}

func (s *scheduler) need(g Group) int {
	if g.Alone {
		return s.slots
	}
	return min(max(g.Slots, 1), s.slots)
}

// take waits until one of the pending jobs can start, takes its slots and
// ports and returns its index in pending: the first in order that fits, so
// a group waiting for a port does not hold back the groups after it. It
// returns false when the run is cancelled.
func (s *scheduler) take(pending []int, jobs []job) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.ctx.Err() == nil {
		for k, i := range pending {
			g := jobs[i].group
			if s.need(g) > s.free || slices.ContainsFunc(g.HostPorts, func(p int) bool { return s.ports[p] }) {
				continue
			}
			s.free -= s.need(g)
			for _, p := range g.HostPorts {
				s.ports[p] = true
			}
			return k, true
		}
		s.cond.Wait()
	}
	return 0, false
}

// release gives back what an ended group took.
func (s *scheduler) release(g Group) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free += s.need(g)
	for _, p := range g.HostPorts {
		delete(s.ports, p)
	}
	s.cond.Broadcast()
}

// groupDone matches the line a runner prints when a group ends.
var groupDone = regexp.MustCompile(`^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped in `)

// childProgress matches a child's progress line: its elapsed time in
// brackets, then the message.
var childProgress = regexp.MustCompile(`^\[[0-9hms.]+\] (.*)$`)

// runChild runs one job as a child conformance process and returns its
// groups and specs from the report it wrote; when it wrote none, every spec
// it was to run fails with the reason. worldUp is called when the child's
// world is up (or it gave up starting one).
func runChild(ctx context.Context, o Options, j job, worldUp func(), say func(string, ...any)) ([]GroupResult, []SpecResult) {
	dir := filepath.Join(o.OutDir, "parallel", fmt.Sprintf("%s-%s-%s", j.mode, j.group.Suite, j.group.Name))
	t0 := time.Now()
	failAll := func(err error) ([]GroupResult, []SpecResult) {
		gr := GroupResult{Mode: j.mode, Suite: j.group.Suite, Group: j.group.Name, Seconds: time.Since(t0).Seconds(), Error: err.Error(), Logs: dir}
		specs := append([]SpecResult(nil), j.inapplicable...)
		for _, text := range j.want {
			specs = append(specs, SpecResult{Mode: j.mode, Suite: j.group.Suite, Group: j.group.Name, Spec: text, State: StateFailed, Message: "not run: " + err.Error()})
		}
		return []GroupResult{gr}, specs
	}
	if err := os.RemoveAll(dir); err != nil {
		return failAll(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return failAll(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "runner.log"))
	if err != nil {
		return failAll(err)
	}
	defer logFile.Close()
	cmd := o.Child(j.mode, j.group, dir)
	if !j.group.Urgent {
		if err := niced(cmd, backgroundNice); err != nil {
			say("runs at normal priority: %v", err)
		}
	}
	// Its own process group, so that a signal from the terminal reaches the
	// parent only, which stops the children in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return failAll(err)
	}
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		return failAll(fmt.Errorf("starting the group's runner: %w", err))
	}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logFile, line)
			if m := childProgress.FindStringSubmatch(line); m != nil {
				msg := trimChildPrefix(m[1])
				if strings.HasPrefix(msg, "world up in ") {
					worldUp()
				}
				if groupDone.MatchString(msg) {
					worldUp() // it gave up starting a world, or is done
					continue  // the parent says it, from the report
				}
				say("%s", msg)
			}
		}
	}()
	exited := make(chan error, 1)
	go func() { <-scanned; exited <- cmd.Wait() }()
	var runErr error
	select {
	case runErr = <-exited:
	case <-ctx.Done():
		// The child stops its suite, provider and world on SIGTERM; a child
		// that does not within two minutes is killed with its group.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case runErr = <-exited:
		case <-time.After(2 * time.Minute):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			runErr = <-exited
		}
	}
	// What the child started and left behind (envtest leaves the API
	// server of a start attempt that timed out running) is in its process
	// group: stop it.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	child, err := readReport(filepath.Join(dir, "report.json"))
	if err != nil || child.Seconds == 0 {
		if runErr == nil {
			runErr = fmt.Errorf("no report: %v", err)
		}
		return failAll(fmt.Errorf("the group's runner ended without a report (%v); see %s", runErr, filepath.Join(dir, "runner.log")))
	}
	return child.Groups, child.Specs
}

// backgroundNice is the niceness of the runners of groups that are not
// Urgent (Group.Urgent).
const backgroundNice = 10

// niced makes cmd run under nice(1) at niceness n. nice(1) execs the
// program, so the process is the same one (its PID, its process group), and
// every thread and process it starts inherits the niceness; setpriority(2)
// on a Go process already running would set it for one of its threads only.
func niced(cmd *exec.Cmd, n int) error {
	path, err := exec.LookPath("nice")
	if err != nil {
		return fmt.Errorf("finding nice(1): %w", err)
	}
	cmd.Args = append([]string{path, "-n", strconv.Itoa(n), cmd.Path}, cmd.Args[1:]...)
	cmd.Path = path
	return nil
}

// trimChildPrefix drops what the child's progress line says of the mode and
// group ("machine mode (1/1), group regression/Drift (1/1): "): the parent's
// prefix says it.
func trimChildPrefix(s string) string {
	if _, rest, ok := strings.Cut(s, "): "); ok && strings.Contains(s[:len(s)-len(rest)], " mode (") {
		return rest
	}
	return s
}

func readReport(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := &Report{}
	if err := json.Unmarshal(data, r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}
