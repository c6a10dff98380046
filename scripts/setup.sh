#!/usr/bin/env bash
# Installs uv (pinned, from PyPI) when missing and syncs the locked environment into .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION="0.13.8"
uv_version() { command -v uv >/dev/null 2>&1 && uv --version | awk '{print $2}'; }
if [[ "$(uv_version)" != "$UV_VERSION" ]]; then
  python3 -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION" || {
    echo "setup: could not install uv $UV_VERSION from PyPI with python3's pip (a distribution's python3 may" \
      "refuse it: externally managed); install it another way (pipx install uv==$UV_VERSION) and run again" >&2
    exit 1
  }
fi
if [[ "$(uv_version)" != "$UV_VERSION" ]]; then  # installed, but another uv comes first on PATH
  echo "setup: uv $UV_VERSION is needed, but $(command -v uv || echo 'no uv') on PATH is version $(uv_version):" \
    "put the one pip installed first on PATH (python3 -m pip show -f uv says where) and run again" >&2
  exit 1
fi
# Bytecode is compiled at install time: the trainer starts in ~2 s instead of ~6 s
# (importing torch and its optimizers from source is slow, and PYTHONDONTWRITEBYTECODE may be set).
uv sync --locked --all-packages --group dev --compile-bytecode --quiet
