"""The third-party packages of the GPU check (docs/benchmarks.md, "A GPU check in one call"), at
uv.lock's versions, split by what the device image holds (scripts/gpu/image.txt):

    python scripts/gpu/requirements.py carried   # what the image lacks: wheels in .gpu/
    python scripts/gpu/requirements.py held      # what it holds: the rehearsal's stand-in for it

The packages are those of the operator with its `local` extra (`mpjob run`), the trainer with
its `fp8` extra (torchao) and the test runner (pytest, pytest-timeout), on CPython 3.12 on
x86-64 Linux. The image's torch (and its CUDA libraries) is never carried: the check runs on it.
In `held`, torch and the versions image.txt names replace uv.lock's, so that the stand-in is the
image as far as these packages go.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

from packaging.markers import Marker
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
#: `uv export` selections: (package, extras).
EXPORTS = [("mpjob", ["local"]), ("mpjob-trainer", ["fp8"])]
#: From the dev group: what runs the gpu-marked tests.
TEST_RUNNER = ["pytest", "pytest-timeout"]
#: The device's interpreter and machine, for the lock's markers.
TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "os_name": "posix"}  # fmt: skip


def image() -> dict[str, str | None]:
    """image.txt: name -> the version the device notes give (None: not given)."""
    held: dict[str, str | None] = {}
    for line in (ROOT / "scripts/gpu/image.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.strip().partition("==")
            held[canonicalize_name(name)] = version or None
    return held


def exported(package: str, extras: list[str]) -> dict[str, str]:
    """uv.lock's name -> version for one workspace package's dependencies on the target."""
    extra_args = [arg for extra in extras for arg in ("--extra", extra)]
    cmd = ["uv", "export", "--frozen", "--no-hashes", "--no-annotate", "--no-header", "--no-emit-workspace",
           "--no-dev", "--package", package, *extra_args]  # fmt: skip
    text = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    pins: dict[str, str] = {}
    for line in text.splitlines():
        requirement, _, marker = line.partition(";")
        if "==" not in requirement or (marker.strip() and not Marker(marker.strip()).evaluate(TARGET)):
            continue
        name, version = requirement.strip().split("==")
        pins[canonicalize_name(name)] = version
    return pins


def locked(name: str) -> dict[str, Any]:
    """uv.lock's entry of a package."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    return next(p for p in lock["package"] if canonicalize_name(p["name"]) == name)


def needed() -> dict[str, str]:
    pins: dict[str, str] = {}
    for package, extras in EXPORTS:
        pins.update(exported(package, extras))
    pins.update({name: locked(name)["version"] for name in TEST_RUNNER})
    return pins


def torch_stack() -> set[str]:
    """torch, what it requires and its CUDA libraries: the image's, never carried, and left to the
    image's torch's own requirements in the stand-in (torch 2.11 caps setuptools below uv.lock's,
    and pins other CUDA libraries)."""
    names = {"torch", *(canonicalize_name(d["name"]) for d in locked("torch")["dependencies"])}
    return names | {name for name in needed() if name.startswith(("nvidia-", "cuda-"))}


def carried() -> list[str]:
    held, stack = image(), torch_stack()
    return [f"{name}=={version}" for name, version in sorted(needed().items())
            if name not in held and name not in stack]  # fmt: skip


def held() -> list[str]:
    image_versions, stack = image(), torch_stack()
    pins = [f"torch=={image_versions['torch']}"]
    for name, version in sorted(needed().items()):
        if name in image_versions and name not in stack:
            pins.append(f"{name}=={image_versions[name] or version}")
    return pins


def main(argv: list[str]) -> None:
    if argv not in (["carried"], ["held"]):
        sys.exit("usage: requirements.py carried|held")
    print("\n".join(carried() if argv == ["carried"] else held()))


if __name__ == "__main__":
    main(sys.argv[1:])
