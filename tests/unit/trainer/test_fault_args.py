"""Bad input on the paths the smarter fallback and precision by measurement added: each
error names the field and what is allowed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from mpjob_contract.builtin_args import BadTaskArg, poisoned_indices, step_delays
from mpjob_contract.codes import ExitCode
from mpjob_contract.launch import AttemptLaunch, contract_version
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session.attempt import read_launch
from tests.unit.trainer.conftest import run_trainer, spec

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("value", ["some", [1, 99], [-1], [1.5]])
def test_non_finite_samples_names_the_field_and_the_range(value: object) -> None:
    with pytest.raises(BadTaskArg, match=r"task\.args\.nonFiniteSamples: expected \"all\" or a list of sample"):
        poisoned_indices(value, 10)


@pytest.mark.parametrize("value", [{"fp8": 0.1}, {"fp32": -1}, {"bf16": 61}, [0.1]])
def test_step_delay_names_the_field_and_what_is_allowed(value: object) -> None:
    with pytest.raises(BadTaskArg, match=r"task\.args\.stepDelay: expected \{fp32\|bf16\|fp16: seconds"):
        step_delays(value)


def test_a_launch_whose_split_changes_the_samples_per_step_is_refused() -> None:
    job = {"task": {"builtin": "mlp"}, "training": {"batchSize": 16}}
    with pytest.raises(ValidationError, match="microBatch 3 x gradAccumulation 4 x workers 1 must equal"):
        AttemptLaunch.model_validate(
            {"jobName": "j", "precision": "fp32", "spec": job, "microBatch": 3, "gradAccumulation": 4}
        )


def test_a_smaller_elastic_attempt_keeps_the_global_batch() -> None:
    job = {"workers": 3, "task": {"builtin": "mlp"}, "training": {"batchSize": 4}, "elastic": {"minWorkers": 2}}
    base = {"jobName": "j", "precision": "fp32", "spec": job, "workers": 2}
    launch = AttemptLaunch.model_validate({**base, "microBatch": 3, "gradAccumulation": 2})
    trained = launch.attempt_spec()
    assert (trained.workers, trained.training.batch_size, trained.training.grad_accumulation) == (2, 3, 2)
    assert launch.spec.workers == 3  # the job's own spec: its config digest stays the same
    with pytest.raises(ValidationError, match="x workers 2 must equal"):
        AttemptLaunch.model_validate({**base, "microBatch": 4, "gradAccumulation": 1})


@pytest.mark.process
def test_validation_on_a_task_without_an_eval_set_is_a_config_error_naming_the_field(tmp_path: Path) -> None:
    job = spec(
        task={"module": "tests.unit.trainer.recording_task:without_eval", "args": {"inputs": 8, "hidden": 16}},
        validation={"everySteps": 5},
    )
    run = run_trainer(tmp_path, job, "fp32", extra={"PYTHONPATH": str(REPO)})
    assert run.code == ExitCode.CONFIG_ERROR, run.stderr
    assert run.report is not None and "validation.everySteps" in run.report.message
    assert "eval_dataset" in run.report.message


def launch_text(**extra: object) -> str:
    launch = AttemptLaunch.model_validate({"jobName": "j", "precision": "fp32", "spec": {"task": {"builtin": "mlp"}}})
    return json.dumps({**json.loads(launch.to_env()), **extra})


def test_a_launch_says_which_release_wrote_it() -> None:
    assert json.loads(launch_text())["contract"] == contract_version() != "unknown"


@pytest.mark.parametrize(("release", "told"), [("9.9.9", True), (None, False)], ids=["other", "same"])
def test_a_launch_this_trainer_cannot_read_names_both_releases_when_they_differ(
    tmp_path: Path, release: str | None, told: bool
) -> None:
    """A spec.image pinned to an older trainer image meets a field it does not know: the error
    says the operator and the image are different releases."""
    path = tmp_path / "launch.json"
    path.write_text(launch_text(newField=1, **({"contract": release} if release else {})))
    with pytest.raises(ConfigError) as refused:
        read_launch(path)
    said = str(refused.value)
    assert "newField" in said
    assert ("the operator is mpjob 9.9.9, this trainer image mpjob " + contract_version() in said) is told
