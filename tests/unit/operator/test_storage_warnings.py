"""A job whose own recoveries make new Jobs (precision.inPlace false, elastic) while its
checkpoints stay in the pod is warned (mpjob_contract.storage_warnings, worded by spec_warnings):
`mpjob validate` prints it and passes, the operator posts one Warning Event per generation.
The quickstart (no claim, no bucket, fallbacks in place) is not warned."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpjob.cli import main
from mpjob.planning.reconcile import reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.spec_warnings import WarningReason, spec_warnings
from tests.unit.operator.cases import CLAIM, GOOD, S3

pytestmark = pytest.mark.unit
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
NO_IN_PLACE = {"precision": {"mode": "fp16", "inPlace": False}}
ELASTIC = {"workers": 2, "elastic": {"minWorkers": 1}}
WARNING = (
    "spec.checkpoint: checkpoints are kept in the pod (emptyDir) and go with it, and {}: such a recovery "
    "starts over at step 0; set checkpoint.volume.persistentVolumeClaim or checkpoint.storage.s3 to resume "
    "from a checkpoint"
)


REASON = WarningReason.CHECKPOINTS_IN_POD


def spec(**fields: Any) -> MixedPrecisionJobSpec:
    return MixedPrecisionJobSpec.model_validate({"task": {"builtin": "gpt"}, **fields})


def messages(job: MixedPrecisionJobSpec, *, in_pods: bool = True) -> list[str]:
    return [w.message for w in spec_warnings(job, in_pods=in_pods) if w.reason == REASON]


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        (NO_IN_PLACE, "precision.inPlace is false (each fallback is a new Job)"),
        (ELASTIC, "elastic is set (each resize is a new Job)"),
        ({"checkpoint": {"volume": {"emptyDir": {}}}, **NO_IN_PLACE, **ELASTIC},
         "precision.inPlace is false (each fallback is a new Job) and elastic is set (each resize is a new Job)"),
    ],
)  # fmt: skip
def test_restarts_of_the_jobs_own_over_pod_checkpoints_are_warned(fields: dict[str, Any], why: str) -> None:
    assert messages(spec(**fields)) == [WARNING.format(why)]
    assert messages(spec(**fields), in_pods=False) == []  # mpjob run: its checkpoints stay on disk


@pytest.mark.parametrize(
    "fields",
    [{}, {"checkpoint": {"volume": {"emptyDir": {}}}}, {**NO_IN_PLACE, "checkpoint": CLAIM},
     {**ELASTIC, "checkpoint": {"storage": {"s3": S3}}}],
    ids=["in-place-default", "in-place-emptyDir", "claim", "bucket"],
)  # fmt: skip
def test_fallbacks_in_place_or_checkpoints_that_outlive_the_pods_are_not_warned(fields: dict[str, Any]) -> None:
    assert messages(spec(**fields)) == []


def test_validate_says_nothing_of_the_quickstart(capsys: pytest.CaptureFixture[str]) -> None:
    path = EXAMPLES / "quickstart.yaml"
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{path}: ok (1 MixedPrecisionJob)"]


def test_validate_prints_the_warning_and_still_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**GOOD, "spec": {**GOOD["spec"], **NO_IN_PLACE}}))
    assert main(["validate", str(path)]) == 0
    why = "precision.inPlace is false (each fallback is a new Job)"
    assert capsys.readouterr().out.splitlines() == [
        f"{path}: warning: {WARNING.format(why)}",
        f"{path}: ok (1 MixedPrecisionJob)",
    ]


def test_the_operator_posts_it_once_per_generation_and_still_starts_the_job() -> None:
    job = spec(**ELASTIC)
    first = reconcile(job, MixedPrecisionJobStatus(), 1, {}, NOW)
    why = "elastic is set (each resize is a new Job)"
    assert [(e.type, e.message) for e in first.events if e.reason == REASON] == [("Warning", WARNING.format(why))]
    assert first.create, "the job is still accepted: its first attempt starts"
    assert [e for e in reconcile(job, first.status, 1, {}, NOW).events if e.reason == REASON] == []
    assert [e for e in reconcile(spec(), MixedPrecisionJobStatus(), 1, {}, NOW).events if e.reason == REASON] == []


def _fp8_warnings(job: MixedPrecisionJobSpec, *, in_pods: bool = True) -> list[str]:
    return [w.message for w in spec_warnings(job, in_pods=in_pods) if w.field == "precision.mode"]


def test_fp8_on_a_cpu_job_in_pods_is_warned_as_certain_to_fail() -> None:
    """A CPU job's pods see no GPU, so `mode: fp8` without emulation is a ConfigError at its first
    attempt: said up front. Emulated, on GPUs, `auto`, or under `mpjob run` (the machine's own
    devices), it is not."""
    cpu = {"resources": {"gpusPerWorker": 0}}
    (said,) = _fp8_warnings(spec(precision={"mode": "fp8"}, **cpu))
    assert said.startswith("spec.precision.mode: precision.mode=fp8 with resources.gpusPerWorker=0")
    assert "precision.fp8.emulate: true" in said
    assert _fp8_warnings(spec(precision={"mode": "fp8", "fp8": {"emulate": True}}, **cpu)) == []
    assert _fp8_warnings(spec(precision={"mode": "fp8"}, resources={"gpusPerWorker": 1})) == []
    assert _fp8_warnings(spec(precision={"mode": "auto"}, **cpu)) == []
    assert _fp8_warnings(spec(precision={"mode": "fp8"}, **cpu), in_pods=False) == []
