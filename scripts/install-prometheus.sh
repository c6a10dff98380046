#!/usr/bin/env bash
# Make `promtool` and `prometheus` available (Debian's `prometheus` package) for the
# observability tests. Idempotent: does nothing when both are already on PATH.
set -euo pipefail
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
  exit 0
fi
if [[ "$(id -u)" -ne 0 ]]; then
  echo "install-prometheus: promtool/prometheus not on PATH and not root; run: sudo apt-get install -y --no-install-recommends prometheus" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-prometheus: promtool/prometheus not on PATH and no apt-get; install Prometheus >= 2.37 by hand" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v promtool >/dev/null && command -v prometheus >/dev/null
