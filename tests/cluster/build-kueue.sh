#!/usr/bin/env bash
# Builds Kueue's controller manager from the exact Go module version pinned in
# tests/cluster/kueue-build/go.mod (and go.sum) into a cache outside git keyed by that
# version, as build.sh does for the control plane. Kept apart from build.sh on purpose: its
# cache key covers build/*/go.mod and build.sh itself, so adding Kueue there would rebuild
# Kubernetes for everyone. Downloading the module also brings Kueue's CRDs and webhook
# manifests into the Go module cache, where tests/cluster/kueue.py reads them. Prints the
# bin directory, then the module's source directory.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mod="$here/kueue-build"

die() { echo "mpjob test cluster: $*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "no Go toolchain on PATH; install Go >= 1.25 (https://go.dev/doc/install) to build Kueue"
KUEUE="$(awk '$1=="require" && $2=="sigs.k8s.io/kueue" {print $3; exit} $1=="sigs.k8s.io/kueue" {print $2; exit}' "$mod/go.mod")"
[[ -n "$KUEUE" ]] || die "could not read the pinned Kueue version from $mod/go.mod"

digest="$(cat "$mod/go.mod" "$mod/go.sum" "$0" | sha256sum | cut -c1-12)"
cache="${MPJOB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpjob}/cluster/kueue-$KUEUE-$digest"
bin="$cache/bin"
mkdir -p "$bin"

export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
log="$cache/build-kueue.log"
if [[ ! -x "$bin/kueue" ]]; then
  echo "mpjob test cluster: building sigs.k8s.io/kueue/cmd/kueue@$KUEUE (log: $log)" >&2
  if ! (cd "$mod" && go build -trimpath -gcflags=all=-dwarf=false -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE" \
      -o "$bin/" sigs.k8s.io/kueue/cmd/kueue) >"$log" 2>&1; then
    if grep -qE "dial tcp|proxy.golang.org|no such host|i/o timeout|TLS handshake" "$log"; then
      die "downloading Go modules for Kueue failed (see $log); check the Go module proxy is reachable (GOPROXY=$(go env GOPROXY))"
    fi
    die "building Kueue failed (see $log)"
  fi
fi
# The CRDs and webhook manifests come from the same module version (already downloaded by
# the build; `go mod download` only checks the cache, or fetches it on a fresh machine).
src="$(cd "$mod" && go mod download -json "sigs.k8s.io/kueue@$KUEUE" | awk -F'"' '$2=="Dir" {print $4}')" \
  || die "could not locate sigs.k8s.io/kueue@$KUEUE in the Go module cache"
[[ -d "$src/config/components/crd/bases" ]] || die "Kueue's CRDs are missing from $src"
echo "$bin"
echo "$src"
