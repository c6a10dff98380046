#!/usr/bin/env bash
# Runs the CPU benchmarks; figures are recorded in docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
for b in trainer_guard sdk_overhead check_overhead trainer_checkpoint first_step cluster_start; do
  echo "== bench/$b.py"
  PYTHONPATH=. uv run --no-sync python "bench/$b.py"
done
