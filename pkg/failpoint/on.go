//go:build failpoints

package failpoint

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
)

// Enabled reports whether crash points are compiled in.
const Enabled = true

type spec struct {
	step string
	n    int64
	hits atomic.Int64
}

var armed = parse(os.Getenv(CrashAfterEnv))

// parse reads "<step>" or "<step>:<n>"; a malformed count arms nothing.
func parse(v string) *spec {
	step, count, hasCount := strings.Cut(strings.TrimSpace(v), ":")
	if step == "" {
		return nil
	}
	n := int64(1)
	if hasCount {
		parsed, err := strconv.ParseInt(count, 10, 64)
		if err != nil || parsed < 1 {
			return nil
		}
		n = parsed
	}
	return &spec{step: step, n: n}
}

// Crash exits the process the n-th time step is reached when the hook names it.
func Crash(step string) {
	s := armed
	if s == nil || s.step != step {
		return
	}
	if s.hits.Add(1) == s.n {
		fmt.Fprintf(os.Stderr, "%s=%s:%d: exiting after the %s step\n", CrashAfterEnv, step, s.n, step)
		os.Exit(ExitCode)
	}
}
