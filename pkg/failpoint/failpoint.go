// Package failpoint lets the end-to-end tests crash the provider right
// after a chosen step, as a crash or an evicted pod would, to prove that an
// interrupted launch or termination resumes without duplicates or leaks.
//
// Crash points are compiled in only with the build tag "failpoints"
// (test/e2e builds the binary with -tags failpoints); in the shipped binary
// Crash does nothing and no environment variable is read.
package failpoint

// CrashAfterEnv names the test hook read by a binary built with the
// failpoints tag: "<step>" or "<step>:<n>" exits the process abruptly the
// n-th time (default 1) the step completes.
const CrashAfterEnv = "KARPENTER_CLUSTERAPI_TEST_CRASH_AFTER"

// ExitCode is the exit code of an injected crash.
const ExitCode = 86
