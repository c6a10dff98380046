"""docs/tutorial.md, part 7, on the real control plane: the tutorial's manifest applied with
kubectl as the page says (the test node runs the image's command with this interpreter for the
image's `python` and the example's own train.py), the fp16 -> bf16 story (in place: one Job),
and `mpjob status` printing the summary the page shows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.integration.operator.conftest import Jobs, Operator
from tests.integration.operator.test_status_command import mpjob_status

pytestmark = pytest.mark.integration

TUTORIAL = Path(__file__).resolve().parents[3] / "examples" / "tutorial"


def test_the_tutorial_manifest_falls_back_on_the_cluster_and_status_tells_it(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str, tmp_path: Path
) -> None:
    job = yaml.safe_load((TUTORIAL / "tutorial.yaml").read_text())
    command = job["spec"]["task"]["command"]
    assert command[:2] == ["python", "train.py"]  # what the image runs in its working directory
    job["spec"]["task"]["command"] = [sys.executable, str(TUTORIAL / "train.py"), *command[2:]]
    manifest = tmp_path / "tutorial.yaml"
    manifest.write_text(yaml.safe_dump(job))
    jobs.pvc(job["spec"]["checkpoint"]["volume"]["persistentVolumeClaim"]["claimName"])
    applied = subprocess.run(
        ["kubectl", "--kubeconfig", kubeconfig, "-n", namespace, "apply", "-f", str(manifest)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert applied.returncode == 0 and applied.stdout.strip() == "mixedprecisionjob.mpjob.dev/tutorial created"
    status = jobs.wait_phase("tutorial", ("Succeeded", "Failed"), 300)
    assert (status["phase"], status["precision"], status["step"]) == ("Succeeded", "bf16", 80), status
    first, second = status["attempts"]
    assert (first["precision"], first["reason"], second["precision"], second["startStep"]) == (
        "fp16",
        "NumericFault",
        "bf16",
        40,
    )
    done = mpjob_status("tutorial", "-n", namespace, "--kubeconfig", kubeconfig, "--plot", str(tmp_path / "t.png"))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"{namespace}/tutorial: Succeeded in bf16 at step 80"
    assert lines[1].startswith(f"  attempt 0: fp16 steps 0-{first['endStep']} NumericFault (MaxNonFiniteLosses: ")
    assert "the precision is at fault" in lines[1]
    assert re.fullmatch(r"  attempt 1: bf16 steps 40-80, back in \d+\.\d+ s in place Succeeded", lines[2]), lines[2]
    assert lines[3] == "  recoveries: 1 (fp16 -> bf16)"
    assert second["inPlace"] is True and jobs.attempt_jobs("tutorial") == ["tutorial-a0"]  # one pod, both attempts
    assert lines[-1] == f"  plot: {tmp_path / 't.png'}"
