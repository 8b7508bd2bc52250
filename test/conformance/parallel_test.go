package conformance

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeChildEnv makes this test binary act as a group's runner: it writes
// when it started and ended, prints a progress line and writes a report of
// one passed spec, or exits 3 without a report when the group is "Broken".
const fakeChildEnv = "CONFORMANCE_FAKE_CHILD"

func init() {
	spec := os.Getenv(fakeChildEnv)
	if spec == "" {
		return
	}
	fields := strings.Split(spec, "|") // mode|suite|group|out|events
	mode, suite, group, out, events := Mode(fields[0]), fields[1], fields[2], fields[3], fields[4]
	record := func(what string) {
		f, err := os.OpenFile(events, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
		if err == nil {
			fmt.Fprintf(f, "%d %s %s\n", time.Now().UnixNano(), what, group)
			f.Close()
		}
	}
	record("start")
	if n, err := ownNice(); err == nil {
		_ = os.WriteFile(filepath.Join(out, "nice"), []byte(strconv.Itoa(n)), 0o644)
	}
	fmt.Printf("[1s] %s mode (1/1), group %s/%s (1/1): world up in 1s (/tmp/fake); running 1 specs\n", mode, suite, group)
	fmt.Printf("[1s] %s mode (1/1), group %s/%s (1/1): 1/1 specs done\n", mode, suite, group)
	// The two longest (started first) wait for each other: a scheduler
	// that ran one at a time would have the first give up after 30 s, and
	// then it ran alone.
	if group == "Long" || group == "Middle" {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			data, _ := os.ReadFile(events)
			if strings.Contains(string(data), "start Long") && strings.Contains(string(data), "start Middle") {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// PortA holds a host port until its sibling PortB starts beside it
	// (what a scheduler blind to ports does) or the port-free group Other
	// has run and ended beside it (a scheduler that let PortB's wait hold
	// back the groups after it would have PortA give up after 30 s).
	if group == "PortA" {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			data, _ := os.ReadFile(events)
			if strings.Contains(string(data), "start PortB") || strings.Contains(string(data), "end Other") {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Wide takes two of three slots and Big the third: both wait (3 s at
	// most) for Other to start beside them, which only a scheduler blind
	// to Wide's slots lets happen.
	if group == "Wide" || group == "Big" {
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			data, _ := os.ReadFile(events)
			if strings.Contains(string(data), "start Other") {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	record("end")
	if group == "Broken" {
		os.Exit(3)
	}
	r := &Report{Started: time.Now(), Seconds: 0.3, Modes: []Mode{mode},
		Groups: []GroupResult{{Mode: mode, Suite: suite, Group: group, Seconds: 0.3}},
		Specs:  []SpecResult{{Mode: mode, Suite: suite, Group: group, Spec: group + " works", State: StatePassed}}}
	if err := r.WriteJSON(filepath.Join(out, "report.json")); err != nil {
		os.Exit(4)
	}
	fmt.Printf("[2s] %s mode (1/1), group %s/%s (1/1): 1 passed, 0 failed, 0 skipped in 1s\n", mode, suite, group)
	os.Exit(0)
}

// Groups run at once in child processes: never more than Parallel at a
// time, the longest first, the report in the groups' order whatever order
// they end in, a child that writes no report fails its specs with a reason,
// and a group with only inapplicable specs starts no child.
func TestRunParallelMergesChildrenInOrder(t *testing.T) {
	out := t.TempDir()
	events := filepath.Join(out, "events")
	g := func(name string, minutes int) Group { return Group{Suite: "regression", Name: name, Minutes: minutes} }
	jobs := []job{
		{mode: ModeMachine, group: g("Short", 1), want: []string{"Short works"}},
		{mode: ModeMachine, group: g("Long", 30), want: []string{"Long works"}},
		{mode: ModeMachine, group: g("Inapplicable", 50), inapplicable: []SpecResult{{Mode: ModeMachine, Suite: "regression", Group: "Inapplicable", Spec: "cannot", State: StateSkipped}}},
		{mode: ModeMachineDeployment, group: g("Broken", 10), want: []string{"Broken a", "Broken b"}},
		{mode: ModeMachineDeployment, group: g("Middle", 20), want: []string{"Middle works"}},
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	o := Options{OutDir: out, Parallel: 2, Child: func(mode Mode, gr Group, dir string) *exec.Cmd {
		cmd := exec.Command(self, "-test.run=^$")
		cmd.Env = append(os.Environ(), fakeChildEnv+"="+strings.Join([]string{string(mode), gr.Suite, gr.Name, dir, events}, "|"))
		return cmd
	}}
	var progress bytes.Buffer
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(&progress, format+"\n", args...)
	}
	r, err := runParallel(context.Background(), o, &Report{Started: time.Now()}, jobs, say)
	if err != nil {
		t.Fatal(err)
	}

	var got []string
	for _, s := range r.Specs {
		got = append(got, fmt.Sprintf("%s/%s %s %s", s.Mode, s.Group, s.Spec, s.State))
	}
	want := []string{
		"machine/Short Short works passed",
		"machine/Long Long works passed",
		"machine/Inapplicable cannot skipped",
		"machinedeployment/Broken Broken a failed",
		"machinedeployment/Broken Broken b failed",
		"machinedeployment/Middle Middle works passed",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("specs:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, s := range r.Specs {
		if s.Group == "Broken" && !strings.Contains(s.Message, "without a report") {
			t.Errorf("a spec of the group whose runner wrote no report says %q", s.Message)
		}
	}
	if r.Summary != (Summary{Passed: 3, Failed: 2, Skipped: 1}) {
		t.Errorf("summary %+v", r.Summary)
	}
	if _, err := os.Stat(filepath.Join(out, "report.json")); err != nil {
		t.Errorf("no merged report.json: %v", err)
	}
	if n := strings.Count(progress.String(), "group regression/Short: 1 passed, 0 failed, 0 skipped"); n != 1 {
		t.Errorf("the end of group Short was said %d times, want once:\n%s", n, progress.String())
	}
	if !strings.Contains(progress.String(), "1/1 specs done") {
		t.Errorf("the children's progress did not reach the terminal:\n%s", progress.String())
	}

	// From the children's own records: who started in which order, and how
	// many ran at once.
	evs := readEvents(t, events)
	var starts []string
	running, most := 0, 0
	for _, e := range evs {
		if e.what == "start" {
			starts = append(starts, e.group)
			running++
			most = max(most, running)
		} else {
			running--
		}
	}
	if len(starts) != 4 {
		t.Errorf("children started for %v, want Long, Middle, Broken and Short, none for Inapplicable", starts)
	}
	// The launch order, as the progress lines number it.
	for i, id := range []string{"machine mode, group regression/Long", "machinedeployment mode, group regression/Middle",
		"machinedeployment mode, group regression/Broken", "machine mode, group regression/Short"} {
		if line := fmt.Sprintf("[job %d/4] %s: 1/1 specs done", i+1, id); !strings.Contains(progress.String(), line) {
			t.Errorf("no progress line %q: the longest should start first\n%s", line, progress.String())
		}
	}
	if most != 2 {
		t.Errorf("%d children ran at once, want 2 (Parallel)", most)
	}
}

// A group that runs alone starts after every other group has ended,
// however long it is, and no group runs beside it.
func TestRunParallelRunsAnAloneGroupWithNoOther(t *testing.T) {
	g := func(name string, minutes int, alone bool) Group {
		return Group{Suite: "disruption", Name: name, Minutes: minutes, Alone: alone}
	}
	jobs := []job{
		{mode: ModeMachine, group: g("Quiet", 50, true), want: []string{"Quiet works"}},
		{mode: ModeMachine, group: g("First", 5, false), want: []string{"First works"}},
		{mode: ModeMachine, group: g("Second", 4, false), want: []string{"Second works"}},
		{mode: ModeMachine, group: g("Third", 3, false), want: []string{"Third works"}},
	}
	r, evs := runFakeChildren(t, jobs, 3)
	if r.Summary != (Summary{Passed: 4}) {
		t.Fatalf("summary %+v, want 4 passed", r.Summary)
	}
	running := map[string]bool{}
	others := 0
	for _, e := range evs {
		switch {
		case e.what == "start" && e.group == "Quiet":
			if len(running) > 0 {
				t.Errorf("Quiet started while %v ran", running)
			}
			running[e.group] = true
		case e.what == "start":
			if running["Quiet"] {
				t.Errorf("%s started while Quiet ran alone", e.group)
			}
			running[e.group] = true
			others++
		default:
			delete(running, e.group)
		}
	}
	if others != 3 {
		t.Errorf("%d other groups ran, want 3", others)
	}
	if last := evs[len(evs)-1]; last.group != "Quiet" || last.what != "end" {
		t.Errorf("the run ended with %s %s, want Quiet's end (the longest group, alone, goes last)", last.what, last.group)
	}
}

// Two groups that listen on the same host port (Chaos's specs start a
// manager on :8080) never run at once, and the one waiting does not hold
// back the groups after it.
func TestRunParallelKeepsGroupsOnOnePortApart(t *testing.T) {
	jobs := []job{
		{mode: ModeMachineDeployment, group: Group{Suite: "regression", Name: "PortA", Minutes: 20, HostPorts: []int{8080}}, want: []string{"PortA works"}},
		{mode: ModeMachine, group: Group{Suite: "regression", Name: "PortB", Minutes: 19, HostPorts: []int{8080}}, want: []string{"PortB works"}},
		{mode: ModeMachine, group: Group{Suite: "regression", Name: "Other", Minutes: 1}, want: []string{"Other works"}},
	}
	r, evs := runFakeChildren(t, jobs, 3)
	if r.Summary != (Summary{Passed: 3}) {
		t.Fatalf("summary %+v, want 3 passed", r.Summary)
	}
	var order []string
	running := map[string]bool{}
	for _, e := range evs {
		order = append(order, e.what+" "+e.group)
		if e.what == "start" && e.group == "PortB" && running["PortA"] {
			t.Errorf("PortB started while PortA held port 8080")
		}
		running[e.group] = e.what == "start"
	}
	want := "start PortA, start Other, end Other, end PortA, start PortB, end PortB"
	if got := strings.Join(order, ", "); got != want {
		t.Errorf("the children ran as %q, want %q", got, want)
	}
}

// A group that takes two slots runs beside one other group at most in a run
// of three, and starts first.
func TestRunParallelGivesAGroupTheSlotsItTakes(t *testing.T) {
	jobs := []job{
		{mode: ModeMachineDeployment, group: Group{Suite: "regression", Name: "Big", Minutes: 30}, want: []string{"Big works"}},
		{mode: ModeMachine, group: Group{Suite: "regression", Name: "Other", Minutes: 19}, want: []string{"Other works"}},
		{mode: ModeMachine, group: Group{Suite: "regression", Name: "Wide", Minutes: 20, Slots: 2}, want: []string{"Wide works"}},
	}
	r, evs := runFakeChildren(t, jobs, 3)
	if r.Summary != (Summary{Passed: 3}) {
		t.Fatalf("summary %+v, want 3 passed", r.Summary)
	}
	slots := map[string]int{"Big": 1, "Other": 1, "Wide": 2}
	used := 0
	for i, e := range evs {
		if i == 0 && (e.what != "start" || e.group != "Wide") {
			t.Errorf("first event %s %s, want the group taking two slots to start first", e.what, e.group)
		}
		if e.what == "start" {
			used += slots[e.group]
		} else {
			used -= slots[e.group]
		}
		if used > 3 {
			t.Errorf("%d slots in use after %s %s, the run has 3", used, e.what, e.group)
		}
	}
}

// runFakeChildren runs jobs with runParallel, each job a fake child (this
// test binary), at most parallel at once, and returns the report and the
// children's records in time order.
func runFakeChildren(t *testing.T, jobs []job, parallel int) (*Report, []childEvent) {
	t.Helper()
	return runFakeChildrenIn(t, t.TempDir(), jobs, parallel)
}

// runFakeChildrenIn is runFakeChildren with the run's output directory
// given: the children's directories are under out/parallel.
func runFakeChildrenIn(t *testing.T, out string, jobs []job, parallel int) (*Report, []childEvent) {
	t.Helper()
	events := filepath.Join(out, "events")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	o := Options{OutDir: out, Parallel: parallel, Child: func(mode Mode, gr Group, dir string) *exec.Cmd {
		cmd := exec.Command(self, "-test.run=^$")
		cmd.Env = append(os.Environ(), fakeChildEnv+"="+strings.Join([]string{string(mode), gr.Suite, gr.Name, dir, events}, "|"))
		return cmd
	}}
	r, err := runParallel(context.Background(), o, &Report{Started: time.Now()}, jobs, func(string, ...any) {})
	if err != nil {
		t.Fatal(err)
	}
	return r, readEvents(t, events)
}

// childEvent is one line a fake child recorded: when it started or ended.
type childEvent struct {
	at          int64
	what, group string
}

// readEvents returns the fake children's records in time order.
func readEvents(t *testing.T, events string) []childEvent {
	t.Helper()
	data, err := os.ReadFile(events)
	if err != nil {
		t.Fatal(err)
	}
	var evs []childEvent
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(line)
		at, _ := strconv.ParseInt(f[0], 10, 64)
		evs = append(evs, childEvent{at, f[1], f[2]})
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].at < evs[j].at })
	return evs
}

// ownNice reads this process's niceness from /proc (field 19 of its stat).
func ownNice() (int, error) {
	data, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name in %q", data)
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 17 {
		return 0, fmt.Errorf("short stat %q", data)
	}
	return strconv.Atoi(fields[16])
}

// An Urgent group's runner runs at the parent's priority and every other
// group's runner ten steps nicer, with the process the scheduler waits on
// (the child writes its report, the parent reads it) being the same one.
func TestRunParallelGivesAnUrgentGroupTheCPUFirst(t *testing.T) {
	base, err := ownNice()
	if err != nil {
		t.Fatal(err)
	}
	if base >= 19 {
		t.Skipf("the test itself runs at niceness %d, the lowest priority: nothing is nicer", base)
	}
	out := t.TempDir()
	jobs := []job{
		{mode: ModeMachine, group: Group{Suite: "regression", Name: "Hurried", Minutes: 2, Urgent: true}, want: []string{"Hurried works"}},
		{mode: ModeMachine, group: Group{Suite: "regression", Name: "Patient", Minutes: 1}, want: []string{"Patient works"}},
	}
	r, _ := runFakeChildrenIn(t, out, jobs, 2)
	if r.Summary != (Summary{Passed: 2}) {
		t.Fatalf("summary %+v, want both passed", r.Summary)
	}
	for name, want := range map[string]int{"Hurried": base, "Patient": min(base+backgroundNice, 19)} {
		data, err := os.ReadFile(filepath.Join(out, "parallel", "machine-regression-"+name, "nice"))
		if err != nil {
			t.Fatalf("group %s's runner did not record its niceness: %v", name, err)
		}
		if got, _ := strconv.Atoi(string(data)); got != want {
			t.Errorf("group %s's runner ran at niceness %d, want %d (the test's own is %d)", name, got, want, base)
		}
	}
}

// The groups whose specs must bring up 100 nodes within a fixed time get
// the CPU: Performance first (Urgent), Utilization to itself (Alone); no
// other group is urgent, or niceness would buy nothing.
func TestScaleGroupsGetTheCPU(t *testing.T) {
	urgent := map[string]bool{"regression/Performance": true}
	alone := map[string]bool{"regression/Utilization": true, "disruption/RepairBreaker": true}
	for _, g := range Groups {
		id := g.Suite + "/" + g.Name
		if g.Urgent != urgent[id] {
			t.Errorf("group %s: Urgent is %v, want %v", id, g.Urgent, urgent[id])
		}
		if g.Alone != alone[id] {
			t.Errorf("group %s: Alone is %v, want %v", id, g.Alone, alone[id])
		}
	}
}
