"""The spec's training settings against a framework script's own, for both adapters.

The samples per step (`spec.training.batchSize` x `gradAccumulation`) are the job's: a resume
holds to them (the config digest; `mpjob run` binds them in job.json), and the operator splits
them for an attempt (a fallback into fp32, running out of device memory, fewer elastic workers:
half the micro-batch, twice the accumulation). A script's own micro-batch or accumulation that
is neither the job's nor this attempt's would train other steps than the job, its report and
its checkpoints say, and take no split: it is a ConfigError naming both. One that is the job's,
in an attempt the operator split, trains in the attempt's split, and the script is told.
"""

from __future__ import annotations

import sys
from typing import Any

from mpjob_contract.spec import Training
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session import Session


def spec_name(field: str) -> str:
    return f"spec.training.{Training.model_fields[field].alias or field}"


def attempt_value(run: Session, setting: str, field: str, given: Any) -> int:
    """The attempt's `spec.training.<field>` for the script's `setting=given` (None: not given):
    `given` must be the job's value or the attempt's."""
    job, attempt = getattr(run.launch.spec.training, field), getattr(run.spec.training, field)
    if given is None or given in (job, attempt):
        return int(attempt)
    split = f", {attempt} in this attempt's split" if attempt != job else ""
    raise ConfigError(
        f"{setting}={given!r} is not {spec_name(field)} ({job}{split}): the spec's samples per step are the "
        "job's (a resume holds to them, and the operator splits them after a fallback into fp32 or an "
        f"out-of-memory); set {spec_name(field)} instead, and leave {setting} to the adapter"
    )


def attempt_shape(run: Session, given: dict[str, Any], fields: dict[str, str], where: str) -> dict[str, int]:
    """The attempt's values of the framework's settings `fields` (setting -> spec.training field)
    for the script's `given` ones; told on stderr when the attempt's split changes one."""
    shape = {setting: attempt_value(run, setting, field, given.get(setting)) for setting, field in fields.items()}
    changed = {k: (given[k], v) for k, v in shape.items() if given.get(k) is not None and given[k] != v}
    if changed:
        what = ", ".join(f"{k}={old} -> {new}" for k, (old, new) in changed.items())
        print(
            f"mpjob: {where}({what}): this attempt's micro-batch split (the operator's, after a fallback into "
            "fp32, an out-of-memory or fewer elastic workers; the same samples per step) trains",
            file=sys.stderr,
            flush=True,
        )
    return shape
