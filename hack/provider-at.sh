#!/usr/bin/env bash
# Builds the provider binary of an earlier commit of this repository, for the
# end-to-end test that upgrades in place from it (test/e2e, E2E_UPGRADE=1).
# The commit is checked out with `git worktree add` into a temporary
# directory (the current checkout is not touched) and built as test/e2e
# builds the current provider (tags failpoints, CGO off). The binary is cached
# outside the repository, keyed by the full commit, so a second run costs
# nothing. Prints the path of the binary on its last line of stdout; progress
# goes to stderr.
#
# Usage: hack/provider-at.sh COMMIT
set -euo pipefail
cd "$(dirname "$0")/.."

export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
if [ $# -ne 1 ]; then
  echo "usage: $0 COMMIT" >&2
  exit 2
fi
commit="$(git rev-parse --verify "$1^{commit}")"
CACHE_ROOT="${PROVIDER_AT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/karpenter-clusterapi/provider}"
DEST="$CACHE_ROOT/$commit"
BIN="$DEST/karpenter-clusterapi"
if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi

mkdir -p "$DEST"
work="$(mktemp -d)"
cleanup() {
  git worktree remove --force "$work/src" >/dev/null 2>&1 || true
  rm -rf "$work"
  git worktree prune >/dev/null 2>&1 || true
}
trap cleanup EXIT
start=$(date +%s)
echo "provider-at: building the provider at ${commit:0:12} (first run only)" >&2
git worktree add --detach --quiet "$work/src" "$commit"
(cd "$work/src" && CGO_ENABLED=0 go build -tags failpoints -o "$BIN.tmp" .)
mv "$BIN.tmp" "$BIN"
echo "provider-at: done ($(( $(date +%s) - start ))s)" >&2
echo "$BIN"
