//go:build !failpoints

package failpoint

import (
	"os"
	"testing"
)

// The shipped binary never crashes on purpose, whatever its environment says.
func TestCrashIsInertWithoutTheBuildTag(t *testing.T) {
	t.Setenv(CrashAfterEnv, "md-bind")
	Crash("md-bind")
	if Enabled {
		t.Fatal("crash points compiled in without the failpoints tag")
	}
	_ = os.Getenv(CrashAfterEnv)
}
