"""A spec too large to start a trainer process with (it travels whole in one environment
variable, which Linux bounds) is refused up front, naming its largest part, not stored and run
into pods that cannot start (mpjob_contract.spec_size)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from mpjob.validation import check_text
from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.launch import LAUNCH_ENV, AttemptLaunch
from mpjob_contract.spec_size import LAUNCH_FIELDS_BYTES, MAX_ARG_STRLEN, MAX_SPEC_BYTES
from tests.unit.operator.cases import GOOD, bad, with_args

pytestmark = pytest.mark.unit

#: A task argument of about 180 KB: a word list passed inline.
WORDS = [f"word{i:05d}" for i in range(16_000)]


def _problems(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p.field, p.message) for p in check_text(yaml.safe_dump(manifest))[1]]


def test_a_long_task_argument_is_refused_naming_it() -> None:
    (problem,) = _problems(with_args({"lr": 0.1, "vocab": WORDS}))
    assert problem[0] == "spec.task.args.vocab"
    assert f"past the {MAX_SPEC_BYTES}" in problem[1] and LAUNCH_ENV in problem[1]


def test_many_template_variables_are_refused_naming_the_list() -> None:
    env = [{"name": f"V{i}", "value": "x" * 1000} for i in range(200)]
    assert [field for field, _ in _problems(bad("spec.template.env", env))] == ["spec.template.env"]


def test_the_largest_spec_is_taken_and_one_byte_more_refused() -> None:
    padded = with_args({"pad": ""})
    base = len(MixedPrecisionJobSpec.model_validate(padded["spec"]).model_dump_json(by_alias=True))
    assert _problems(with_args({"pad": "x" * (MAX_SPEC_BYTES - base)})) == []
    assert [f for f, _ in _problems(with_args({"pad": "x" * (MAX_SPEC_BYTES - base + 1)}))] == ["spec.task.args.pad"]


def test_a_refused_spec_could_never_start_a_trainer() -> None:
    """The bound is certain: the launch's own fields take more than LAUNCH_FIELDS_BYTES beside
    the spec, and execve refuses an environment string past MAX_ARG_STRLEN."""
    spec = MixedPrecisionJobSpec.model_validate(GOOD["spec"])
    launch = AttemptLaunch(job_name="j", precision="fp8", spec=spec, contract="").to_env()
    assert len(launch) - len(spec.model_dump_json(by_alias=True)) > LAUNCH_FIELDS_BYTES
    most = MAX_ARG_STRLEN - 1 - len(f"{LAUNCH_ENV}=")
    subprocess.run(["true"], env={LAUNCH_ENV: "x" * most}, check=True)
    with pytest.raises(OSError, match="Argument list too long"):
        subprocess.run(["true"], env={LAUNCH_ENV: "x" * (most + 1)}, check=True)
