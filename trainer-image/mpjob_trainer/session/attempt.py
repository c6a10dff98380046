"""The attempt a process belongs to: its AttemptLaunch, and what its checkpoints must match.

The operator (and `mpjob run`) describe the attempt as JSON in MPJOB_LAUNCH
(mpjob_contract.launch); `mpjob-trainer --launch FILE` reads it from a file. A missing or
invalid description is a configuration error: retrying the same pod cannot fix it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from mpjob_contract import binding, k8s
from mpjob_contract.launch import LAUNCH_ENV, AttemptLaunch, contract_version
from mpjob_trainer.errors import ConfigError

LaunchSource = AttemptLaunch | str | os.PathLike[str] | None


def read_launch(source: LaunchSource = None) -> AttemptLaunch:
    """The attempt: given, read from a file, or (None) from $MPJOB_LAUNCH."""
    if isinstance(source, AttemptLaunch):
        return source
    if source is not None:
        try:
            text = Path(source).read_text()
        except OSError as exc:
            raise ConfigError(f"--launch {source}: {exc.strerror}") from exc
    else:
        text = os.environ.get(LAUNCH_ENV, "")
        if not text:
            raise ConfigError(f"no attempt description: set {LAUNCH_ENV} or pass --launch FILE")
    try:
        return AttemptLaunch.model_validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(said for e in exc.errors() for said in _said(e))
        raise ConfigError(f"invalid attempt description: {problems}{_other_release(text)}") from exc


def _said(error: ErrorDetails) -> list[str]:
    """One validation error as `field: what is wrong`; a schema check's violations each at its own field
    (spec.task.args.stepDelay: ..., as `mpjob validate` names it)."""
    where = ".".join(str(p) for p in error["loc"])
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, k8s.SchemaViolations):
        return [f"{where}.{field}: {why}" for field, why in cause.violations]
    return [f"{where}: {error['msg']}"]


def _other_release(text: str) -> str:
    """Why a launch may be unreadable: the operator and this trainer image are different releases
    (a spec.image pinned to an older image); "" when they are the same or it cannot tell."""
    try:
        said = json.loads(text).get("contract")
    except (ValueError, AttributeError):
        return ""
    mine = contract_version()
    if not isinstance(said, str) or said == mine:
        return ""
    images = f"the operator is mpjob {said[:64]}, this trainer image mpjob {mine}"
    return f" ({images}: use the operator's trainer image, or build yours on it)"


def config_digest(launch: AttemptLaunch) -> str:
    """What a checkpoint must agree with to be resumable: the model and the data order
    (mpjob_contract.binding, the rule `mpjob run` checks an --out's earlier run by)."""
    return binding.config_digest(launch.spec)
