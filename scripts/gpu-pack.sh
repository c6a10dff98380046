#!/usr/bin/env bash
# Builds .gpu/: the wheels the GPU check installs on the device machine, which has no network
# (docs/benchmarks.md, "A GPU check in one call"): our three packages, built by uv, and the
# third-party packages the device image lacks (scripts/gpu/requirements.py carried), for
# CPython 3.12 on x86-64 Linux, at uv.lock's versions. The device call carries it (<= 60 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT_MIB=60
PY312=$(bash scripts/gpu/python312.sh)
rm -rf .gpu
mkdir -p .gpu
uv build --quiet --all-packages --wheel --out-dir .gpu
uv run --no-sync python scripts/gpu/requirements.py carried >.gpu/carried.txt
platforms=()
for n in 17 24 27 28 31 34 35 39; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
nice -n 19 "$PY312" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp "${platforms[@]}" --platform manylinux2014_x86_64 \
  --dest .gpu -r .gpu/carried.txt
size_kib=$(du -sk .gpu | cut -f1)
echo "gpu-pack: .gpu/ holds $(ls .gpu/*.whl | wc -l) wheels, $((size_kib / 1024)) MiB (limit $LIMIT_MIB MiB)"
if ((size_kib > LIMIT_MIB * 1024)); then
  echo "gpu-pack: .gpu/ is over $LIMIT_MIB MiB: the device call carries at most 64 MiB with the tree" >&2
  exit 1
fi
