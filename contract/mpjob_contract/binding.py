"""What a checkpoint binds a job to: the settings its config digest covers (the model and the
data order), one rule for the trainer that writes and checks the digest and for `mpjob run`,
which refuses to go on in an --out whose run had other ones (its checkpoints would not resume),
and for the API server, which refuses an update of a job that changes one (`UNCHANGED`, CEL
transition rules in the CRD): the next attempt would resume none of the job's checkpoints, train
from step 0 and set them aside as it reached their steps.

The data order depends on the samples per optimizer step, not on how an attempt splits them
into micro-batches (mpjob_trainer.data), so attempts with a split micro-batch resume.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.cel import Transition
from mpjob_contract.spec import Training

#: The bound settings by their key in `bound_settings`, and the spec's fields each is made of.
FIELDS = {
    "task": "spec.task",
    "seed": "spec.training.seed",
    "samplesPerStep": "spec.training.batchSize x spec.training.gradAccumulation",
}
#: What an update that changes a bound setting is told: what to do instead.
_WAYS_ON = (
    "a job's checkpoints are bound to it and its next attempt would resume none of them; "
    "to train with another one, delete the job and create it again, or create a job under a new name"
)


def _training(name: str, side: str = "self") -> str:
    """CEL for training's field `name` on `side`, its default where unset: the API server checks
    the rules against training's own default ({}), before the fields' defaults fill it."""
    field = Training.model_fields[name]
    wire = field.alias or name
    return f"(has({side}.{wire}) ? {side}.{wire} : {field.default})"


def _samples(side: str) -> str:
    return f"{_training('batch_size', side)} * {_training('grad_accumulation', side)}"


#: Each bound setting as a CEL transition rule, by its key in FIELDS. The task is compared whole:
#: its args are free-form, and equality is cheap for the API server's cost estimate.
UNCHANGED = {
    "task": Transition("spec.task", "self == oldSelf", f"spec.task (with its args) cannot change: {_WAYS_ON}"),
    "seed": Transition(
        "spec.training",
        f"{_training('seed')} == {_training('seed', 'oldSelf')}",
        f"spec.training.seed cannot change: {_WAYS_ON}",
        ".seed",
    ),
    "samplesPerStep": Transition(
        "spec.training",
        f"{_samples('self')} == {_samples('oldSelf')}",
        "the samples per step (spec.training.batchSize x spec.training.gradAccumulation) cannot change, though "
        f"each of the two may where their product stays: {_WAYS_ON}",
    ),
}
#: The longest value a change names; a longer one is cut.
_SHOWN = 40


def bound_settings(spec: MixedPrecisionJobSpec) -> dict[str, Any]:
    """The settings of `spec` a checkpoint holds to, as JSON values."""
    return {
        "task": spec.task.to_api(),
        "seed": spec.training.seed,
        "samplesPerStep": spec.training.batch_size * spec.training.grad_accumulation,
    }


def config_digest(spec: MixedPrecisionJobSpec) -> str:
    """The digest a checkpoint's manifest names (configDigest): of `bound_settings`."""
    return hashlib.sha256(json.dumps(bound_settings(spec), sort_keys=True).encode()).hexdigest()[:16]


def changed_fields(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """The spec's fields whose bound value differs between two `bound_settings`, each as
    `path (old -> new)`, the task's down to the field that changed (spec.task.args.lr)."""
    said: list[str] = []
    for key, path in FIELDS.items():
        said.extend(_differences(path, before.get(key), after.get(key)))
    return said


def _differences(path: str, old: object, new: object) -> list[str]:
    if old == new:
        return []
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        keys = sorted({*old, *new}, key=str)
        return [line for key in keys for line in _differences(f"{path}.{key}", old.get(key), new.get(key))]
    return [f"{path} ({_shown(old)} -> {_shown(new)})"]


def _shown(value: object) -> str:
    if value is None:
        return "unset"
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."
