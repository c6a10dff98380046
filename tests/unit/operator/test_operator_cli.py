"""`mpjob operator` refuses bad flags before it touches a cluster, naming the flag."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def test_a_bad_priority_is_refused_naming_the_flag() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mpjob.cli", "operator", "--priority", "newest"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "KUBECONFIG": "/nonexistent"},
    )
    assert result.returncode == 2
    assert "--priority: an integer or 'oldest', not 'newest'" in result.stderr
