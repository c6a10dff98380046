#!/usr/bin/env bash
# Rehearses the GPU check here, on the CPU (docs/benchmarks.md, "A GPU check in one call"): a
# stand-in for the device image (CPython 3.12, torch 2.11 and the image's other packages that
# ours need: scripts/gpu/requirements.py held) in .gpu-rehearse/image, then scripts/gpu-run.sh
# over it with OUT=.gpu-rehearse/out and every budget x GPU_BUDGET_SCALE (default 3: the CPU is
# slower). It proves that .gpu/ installs with no index and that every step runs on torch 2.11: the
# benchmark's steps at --tiny, the others a shorter story. Arguments go to scripts/gpu/steps.py.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -d .gpu ]] || { echo "gpu-rehearse: no .gpu/ (make gpu-pack)" >&2; exit 1; }
IMAGE=.gpu-rehearse/image
mkdir -p .gpu-rehearse
uv run --no-sync python scripts/gpu/requirements.py held >.gpu-rehearse/held.txt
echo pip >>.gpu-rehearse/held.txt # the image's python3 has pip; gpu-run.sh installs with it
if [[ ! -x $IMAGE/bin/python ]]; then
  uv venv --quiet --python "$(bash scripts/gpu/python312.sh)" "$IMAGE"
fi
echo "gpu-rehearse: the image's stand-in ($IMAGE: torch $(grep '^torch==' .gpu-rehearse/held.txt | cut -d= -f3))"
nice -n 19 uv pip install --quiet --python "$IMAGE/bin/python" -r .gpu-rehearse/held.txt
rm -rf .gpu-rehearse/out
OUT=.gpu-rehearse/out GPU_PYTHON=$IMAGE/bin/python GPU_VENV=.gpu-rehearse/venv GPU_WORK=.gpu-rehearse/work \
  nice -n 19 bash scripts/gpu-run.sh --budget-scale "${GPU_BUDGET_SCALE:-3}" "$@"
