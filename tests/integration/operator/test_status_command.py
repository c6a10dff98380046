"""`mpjob status` against the real control plane: the summary `mpjob run` prints and the same
plot, for a job that fell back from fp16 to bf16; a clear error for a job that is not there and
for a plot it cannot write."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.operator.conftest import Jobs, Operator
from tests.integration.operator.test_fault_policy import mlp_spec

pytestmark = pytest.mark.integration


def mpjob_status(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mpjob.cli", "status", *args], capture_output=True, text=True, timeout=60
    )


def test_status_sums_up_and_plots_a_job_that_fell_back(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str, tmp_path: Path
) -> None:
    jobs.pvc("ckpt")
    jobs.create("fell", mlp_spec("ckpt", "fp16", every=10, overflowAtStep=15))
    status = jobs.wait_phase("fell", ("Succeeded", "Failed"), 240)
    assert status["phase"] == "Succeeded", status
    plot = tmp_path / "fell.png"
    done = mpjob_status("fell", "-n", namespace, "--kubeconfig", kubeconfig, "--plot", str(plot))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"{namespace}/fell: Succeeded in bf16 at step 30"
    first, second = status["attempts"]
    assert lines[1].startswith(f"  attempt 0: fp16 steps 0-{first['endStep']} NumericFault (")
    back = f"back in {second['recoverySeconds']:.2f} s in place"  # the fallback was made in the pod
    assert lines[2] == f"  attempt 1: bf16 steps {second['startStep']}-30, {back} Succeeded"
    assert "  recoveries: 1 (fp16 -> bf16)" in lines
    assert f"  last checkpoint: step 30 (bf16) sha256 {status['lastCheckpoint']['sha256'][:16]}" in lines
    assert lines[-1] == f"  plot: {plot}" and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    folder = mpjob_status("fell", "-n", namespace, "--kubeconfig", kubeconfig, "--plot", str(tmp_path))
    said = folder.stdout.splitlines()[-1:]
    assert (folder.returncode, said) == (2, [f"error: --plot {tmp_path}: cannot write it (Is a directory)"])
    assert "Traceback" not in folder.stderr, folder.stderr


def test_status_of_a_job_that_is_not_there_says_so(operator: Operator, namespace: str, kubeconfig: str) -> None:
    done = mpjob_status("nothing-here", "-n", namespace, "--kubeconfig", kubeconfig)
    assert (
        done.returncode == 1 and done.stdout.strip() == f"error: MixedPrecisionJob {namespace}/nothing-here not found"
    )
