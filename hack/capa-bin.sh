#!/usr/bin/env bash
# Builds Cluster API Provider AWS's manager (the real CAPA controllers) for the
# end-to-end tests that run it against a simulated EC2 API (test/e2ecapa). It
# is built from CAPA's own module with its own dependency versions: the full
# CAPA module does not compile against the Cluster API version this module
# uses, so it cannot be a dependency here. The binary is cached outside the
# repository, keyed by version, so a second run costs nothing. Prints the path
# of the binary on its last line of stdout; progress goes to stderr.
#
# The version defaults to the CAPA version in go.mod (whose api/v1beta2 types
# the provider reads), so the two never drift apart.
set -euo pipefail
cd "$(dirname "$0")/.."

export GOTOOLCHAIN="${GOTOOLCHAIN_CAPA:-auto}"
CAPA_MODULE=sigs.k8s.io/cluster-api-provider-aws/v2
CAPA_VERSION="${CAPA_VERSION:-$(awk -v m="$CAPA_MODULE" '$1 == m { print $2; exit }' go.mod)}"
if [ -z "$CAPA_VERSION" ]; then
  echo "capa-bin: cannot find $CAPA_MODULE in go.mod; set CAPA_VERSION" >&2
  exit 1
fi
CACHE_ROOT="${CAPA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/karpenter-clusterapi/capa}"
DEST="$CACHE_ROOT/$CAPA_VERSION"
BIN="$DEST/cluster-api-provider-aws"
if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi

mkdir -p "$DEST"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
echo "capa-bin: building CAPA $CAPA_VERSION manager (first run only, about 4 minutes on 2 cores)" >&2
# Outside any module (cd to an empty directory): `go install pkg@version`
# resolves CAPA's own go.mod, not ours.
cd "$work"
GOFLAGS= CGO_ENABLED=0 GOBIN="$work/bin" go install -trimpath -ldflags "-s -w" "$CAPA_MODULE@$CAPA_VERSION"
# go install names the binary after the module path without its /v2.
mv "$work/bin/cluster-api-provider-aws" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
echo "capa-bin: done ($(( $(date +%s) - start ))s)" >&2
echo "$BIN"
