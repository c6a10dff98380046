"""A trainer process starts light: importing its entry point loads neither DCP
(torch.distributed.checkpoint) nor DTensor (torch.distributed.tensor), a second of CPU that
only a sharded run needs (it imports them when it shards or reads a sharded checkpoint)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

PROBE = """
import sys
import mpjob_trainer.__main__
heavy = ("torch.distributed.checkpoint", "torch.distributed.tensor", "transformers", "lightning", "torchao")
print(sorted(name for name in sys.modules if name in heavy))
"""


def test_the_trainer_entry_point_imports_no_sharding_or_framework_module() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout
