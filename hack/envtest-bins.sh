#!/usr/bin/env bash
# Builds the binaries the tests run as real API servers (kube-apiserver, etcd,
# kube-scheduler, kube-controller-manager) from the Go module proxy, because
# setup-envtest needs the internet. They are cached outside the repository,
# keyed by version, so a second run costs nothing. Prints the directory to use
# as KUBEBUILDER_ASSETS on its last line of stdout; progress goes to stderr.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
CACHE_ROOT="${ENVTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/karpenter-clusterapi/envtest}"
DEST="$CACHE_ROOT/k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}"
export GOTOOLCHAIN="${GOTOOLCHAIN_ENVTEST:-auto}"
export GOFLAGS=-mod=mod
export CGO_ENABLED=0

bins=(kube-apiserver kube-scheduler kube-controller-manager etcd)
missing=()
for b in "${bins[@]}"; do [ -x "$DEST/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$DEST"
  exit 0
fi

mkdir -p "$DEST"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
log() { echo "envtest-bins: $* ($(( $(date +%s) - start ))s)" >&2; }

need_k8s=false
for b in "${missing[@]}"; do [ "$b" != etcd ] && need_k8s=true; done

if $need_k8s; then
  log "building ${missing[*]} for Kubernetes $K8S_VERSION (first run only, several minutes)"
  mkdir -p "$work/k8s" && cd "$work/k8s"
  go mod init envtest-k8s >/dev/null 2>&1
  gomod="$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  staging_version="v0${K8S_VERSION#v1}"
  # k8s.io/kubernetes replaces every staging module with a local path; point
  # each one at its published version instead.
  {
    echo "require k8s.io/kubernetes ${K8S_VERSION}"
    sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/.*#replace \1 => \1 '"$staging_version"'#p' "$gomod"
  } >> go.mod
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
  go mod tidy >&2
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${K8S_VERSION} -X k8s.io/client-go/pkg/version.gitVersion=${K8S_VERSION}"
  for b in "${missing[@]}"; do
    [ "$b" = etcd ] && continue
    log "go build $b"
    go build -trimpath -ldflags "$ldflags" -o "$DEST/$b.tmp" "k8s.io/kubernetes/cmd/$b"
    mv "$DEST/$b.tmp" "$DEST/$b"
  done
fi

if [ ! -x "$DEST/etcd" ]; then
  log "building etcd $ETCD_VERSION"
  mkdir -p "$work/etcd" && cd "$work/etcd"
  go mod init envtest-etcd >/dev/null 2>&1
  echo "require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}" >> go.mod
  cat > tools.go <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
  go mod tidy >&2
  go build -trimpath -ldflags "-s -w" -o "$DEST/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$DEST/etcd.tmp" "$DEST/etcd"
fi
log "done"
echo "$DEST"
