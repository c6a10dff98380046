#!/usr/bin/env bash
# Builds versitygw (an S3-compatible gateway with a POSIX backend) from the exact Go module
# version pinned in tests/cluster/s3-build/go.mod (and go.sum) into a cache outside git keyed
# by that version, as build.sh and build-kueue.sh do for theirs. Kept apart from build.sh so
# that pinning another S3 server never rebuilds Kubernetes. Prints the bin directory.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mod="$here/s3-build"

die() { echo "mpjob test cluster: $*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "no Go toolchain on PATH; install Go >= 1.25 (https://go.dev/doc/install) to build versitygw"
VGW="$(awk '$1=="require" && $2=="github.com/versity/versitygw" {print $3; exit}' "$mod/go.mod")"
[[ -n "$VGW" ]] || die "could not read the pinned versitygw version from $mod/go.mod"

digest="$(cat "$mod/go.mod" "$mod/go.sum" "$0" | sha256sum | cut -c1-12)"
cache="${MPJOB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mpjob}/cluster/versitygw-$VGW-$digest"
bin="$cache/bin"
mkdir -p "$bin"

export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
log="$cache/build-s3.log"
if [[ ! -x "$bin/versitygw" ]]; then
  echo "mpjob test cluster: building github.com/versity/versitygw/cmd/versitygw@$VGW (log: $log)" >&2
  if ! (cd "$mod" && go build -trimpath -gcflags=all=-dwarf=false -ldflags "-s -w" -o "$bin/" github.com/versity/versitygw/cmd/versitygw) >"$log" 2>&1; then
    if grep -qE "dial tcp|proxy.golang.org|no such host|i/o timeout|TLS handshake" "$log"; then
      die "downloading Go modules for versitygw failed (see $log); check the Go module proxy is reachable (GOPROXY=$(go env GOPROXY))"
    fi
    die "building versitygw failed (see $log)"
  fi
fi
echo "$bin"
