//go:build !failpoints

package failpoint

// Enabled reports whether crash points are compiled in.
const Enabled = false

// Crash does nothing: crash points are compiled in only with the build tag
// "failpoints".
func Crash(string) {}
