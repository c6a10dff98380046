#!/usr/bin/env bash
# Prints the directory holding the Prometheus Operator CRDs pinned in monitoring-crds/go.mod,
# fetched through the Go module proxy (checked against monitoring-crds/go.sum) into Go's module
# cache; a second run downloads nothing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/monitoring-crds"
command -v go >/dev/null 2>&1 || { echo "mpjob test cluster: no Go toolchain on PATH" >&2; exit 1; }
module=github.com/prometheus-operator/prometheus-operator
dir="$(cd "$here" && GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "$module" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[[ -d "$dir/example/prometheus-operator-crd" ]] || { echo "mpjob test cluster: downloading $module failed" >&2; exit 1; }
echo "$dir/example/prometheus-operator-crd"
