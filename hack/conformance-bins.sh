#!/usr/bin/env bash
# Builds Karpenter's own end-to-end suites (test/suites/regression and
# test/suites/disruption of the sigs.k8s.io/karpenter module, at the version
# go.mod requires) as test binaries, for `make conformance` and the CI subset.
#
# The module cache is read-only, so the module is copied out of it to a work
# directory first. One change is made to that copy, never to anything in this
# repository: the suites' default Eventually timeout, hard-coded to 15 minutes
# for real clouds, is read from KARPENTER_E2E_EVENTUALLY_TIMEOUT (a Go
# duration; 15m when unset), so a local world can fail a spec in minutes.
#
# The binaries are cached outside the repository, keyed by the karpenter
# version and this script's own hash (the patch lives here), so a second run
# costs nothing. Prints the directory holding regression.test and
# disruption.test on its last line of stdout; progress goes to stderr.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
export CGO_ENABLED=0
cd "$root"
version="$(go list -m -f '{{.Version}}' sigs.k8s.io/karpenter)"
src="$(go list -m -f '{{.Dir}}' sigs.k8s.io/karpenter)"
script_hash="$(sha256sum "$0" | cut -c1-12)"
CACHE_ROOT="${CONFORMANCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/karpenter-clusterapi/conformance}"
DEST="$CACHE_ROOT/karpenter-${version}-${script_hash}"
suites=(regression disruption)

missing=()
for s in "${suites[@]}"; do [ -x "$DEST/$s.test" ] || missing+=("$s"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$DEST"
  exit 0
fi

start=$(date +%s)
log() { echo "conformance-bins: $* ($(( $(date +%s) - start ))s)" >&2; }
mkdir -p "$DEST"
work="$(mktemp -d)"
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

log "copying sigs.k8s.io/karpenter@$version out of the module cache"
cp -r "$src" "$work/karpenter"
chmod -R u+w "$work/karpenter"
envgo="$work/karpenter/test/pkg/environment/common/environment.go"
# The one patch: the default Eventually timeout from the environment.
grep -q 'gomega.SetDefaultEventuallyTimeout(15 \* time.Minute)' "$envgo" || {
  echo "conformance-bins: $envgo no longer sets a 15-minute Eventually timeout; update the patch in $0" >&2
  exit 1
}
sed -i 's/gomega.SetDefaultEventuallyTimeout(15 \* time.Minute)/gomega.SetDefaultEventuallyTimeout(eventuallyTimeoutFromEnv())/' "$envgo"
cat >> "$envgo" <<'GO'

// eventuallyTimeoutFromEnv is added by karpenter-clusterapi's
// hack/conformance-bins.sh: KARPENTER_E2E_EVENTUALLY_TIMEOUT (a Go duration)
// replaces the 15 minutes sized for real clouds.
func eventuallyTimeoutFromEnv() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("KARPENTER_E2E_EVENTUALLY_TIMEOUT")); err == nil && d > 0 {
		return d
	}
	return 15 * time.Minute
}
GO
cd "$work/karpenter"
for s in "${missing[@]}"; do
  log "go test -c ./test/suites/$s (the first build compiles Karpenter's test dependencies: several minutes on 2 cores)"
  GOFLAGS=-mod=mod go test -c -trimpath -o "$DEST/$s.test.tmp" "./test/suites/$s"
  mv "$DEST/$s.test.tmp" "$DEST/$s.test"
done
log "done"
echo "$DEST"
