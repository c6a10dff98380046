#!/usr/bin/env bash
# The GPU check, in one call on the device machine (docs/benchmarks.md, "A GPU check in one
# call"): a venv over the image's Python 3.12 and torch, our packages and what the image lacks
# installed from .gpu/ (make gpu-pack) with no index, then scripts/gpu/steps.py's steps, each in
# its own time budget, writing $OUT/summary.json and the logs. `make gpu-rehearse` runs it here
# on the CPU, with GPU_PYTHON naming a stand-in for the image's python3.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder for summary.json and the logs}"
IMAGE_PYTHON=${GPU_PYTHON:-python3}
VENV=${GPU_VENV:-/tmp/mpjob-gpu-venv}
WORK=${GPU_WORK:-/tmp/mpjob-gpu-work}
mkdir -p "$OUT"
began=$SECONDS

install() {
  set -e
  rm -rf "$VENV" "$WORK"
  "$IMAGE_PYTHON" -m venv --system-site-packages --without-pip "$VENV"
  # The image's python3 is itself a venv (/opt/torch/.venv): a venv made from it sees the base
  # interpreter's site-packages, not the image venv's, where torch is. Name those after its own.
  local site
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$IMAGE_PYTHON" -c 'import site; print("\n".join(site.getsitepackages()))' >"$site/image-site-packages.pth"
  "$VENV/bin/python" -m pip install --no-index --no-deps --no-cache-dir --disable-pip-version-check \
    --find-links .gpu .gpu/*.whl
  "$VENV/bin/python" -c 'import torch, mpjob, mpjob_trainer, mpjob_contract; print("torch", torch.__version__)'
}

echo "gpu-run: installing .gpu/ into $VENV over $IMAGE_PYTHON (log: $OUT/setup.log)"
if ! (install) >"$OUT/setup.log" 2>&1; then
  tail -n 30 "$OUT/setup.log"
  echo "gpu-run: the install failed after $((SECONDS - began)) s: see $OUT/setup.log" >&2
  exit 1
fi
echo "gpu-run: installed in $((SECONDS - began)) s; the steps:"
"$VENV/bin/python" scripts/gpu/steps.py --out "$OUT" --work "$WORK" "$@"
status=$?
echo "gpu-run: done in $((SECONDS - began)) s"
exit $status
