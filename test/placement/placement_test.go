package placement

import (
	"os"
	"os/exec"
	"slices"
	"testing"
)

func TestParseAndString(t *testing.T) {
	for in, want := range map[string]string{"0": "0", "1,3": "1,3", "0-2,5": "0-2,5", "3,1,2": "1-3", " 0 ": "0", "": ""} {
		c, err := Parse(in)
		if err != nil || c.String() != want {
			t.Errorf("Parse(%q) = %v (%q), %v; want %q", in, c, c.String(), err, want)
		}
	}
	for _, bad := range []string{"a", "2-1", "-1", "0-", "5000"} {
		if c, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) = %v, want an error", bad, c)
		}
	}
}

// A process started on a CPU set runs there, every thread of it, and the
// starting process keeps its own affinity.
func TestStartPinsTheChildOnly(t *testing.T) {
	online, err := Online()
	if err != nil {
		t.Fatal(err)
	}
	if len(online) < 2 {
		t.Skipf("needs 2 CPUs to tell a pinned process from an unpinned one; this process may use %s", online)
	}
	self, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	last := CPUs{online[len(online)-1]}
	cmd := exec.Command("sleep", "30")
	if err := Start(cmd, last); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	got, err := Of(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, last) {
		t.Errorf("child may run on CPUs %s, want %s", got, last)
	}
	after, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(after, self) {
		t.Errorf("the starting process may run on CPUs %s after the start, %s before", after, self)
	}

	// PinProcess moves a running process, every thread of it.
	if err := PinProcess(cmd.Process.Pid, CPUs{online[0]}); err != nil {
		t.Fatal(err)
	}
	if got, err := Of(cmd.Process.Pid); err != nil || !slices.Equal(got, CPUs{online[0]}) {
		t.Errorf("after PinProcess: CPUs %s, %v; want %d", got, err, online[0])
	}
}
