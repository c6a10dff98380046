"""The operator side never imports torch or torchao: every module of the operator package and
the contract imports in a fresh interpreter with neither loaded (its image carries neither)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

PROBE = """
import importlib, pkgutil, sys
import mpjob, mpjob_contract
for package in (mpjob, mpjob_contract):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(info.name)
print(sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "torchao")))
"""


def test_no_operator_or_contract_module_imports_torch_or_torchao() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout
