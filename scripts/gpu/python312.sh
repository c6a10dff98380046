#!/usr/bin/env bash
# Prints the path of a CPython 3.12 on this machine (the device image's Python): python3.12 on
# the PATH, else pyenv's newest 3.12.
set -euo pipefail
if command -v python3.12 >/dev/null 2>&1 && python3.12 -c "" 2>/dev/null; then
  command -v python3.12
  exit 0
fi
root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
for candidate in $(ls -d "$root"/versions/3.12.* 2>/dev/null | sort -V -r); do
  if [[ -x "$candidate/bin/python3.12" ]]; then
    echo "$candidate/bin/python3.12"
    exit 0
  fi
done
echo "no CPython 3.12 found (python3.12 on the PATH, or pyenv install 3.12)" >&2
exit 1
