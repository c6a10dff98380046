"""A trainer's metrics exposition, parsed once where a scrape's text is read.

The endpoint is the pod's: bounded and checked, never trusted. A series the trainer could not
have written (a label outside what it writes, a value that is not finite or beyond what a
status holds exactly) is no reading; whatever cannot be parsed is dropped with what follows it.
What the labels say is parsed here into typed entries (a named checkpoint, a listed skip, a
figure by precision), so nothing downstream splits a packed key apart again.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, get_args

from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from mpjob.planning.observe import CheckpointReading
from mpjob_contract import metrics as tm
from mpjob_contract.api import Precision
from mpjob_contract.report import InPlaceChange
from mpjob_contract.skipping import CAUSES, SkippedStep, spans_of

log = logging.getLogger("mpjob.operator.progress")

#: Reading field <- the trainer's metric, and the type the status holds it as.
FIGURES: tuple[tuple[str, str, Callable[[float], Any]], ...] = (
    ("step", tm.STEP, int),
    ("loss", tm.LOSS, float),
    ("loss_scale", tm.LOSS_SCALE, float),
    ("overflow_steps", tm.OVERFLOW_STEPS + "_total", int),
    ("samples_per_second", tm.SAMPLES_PER_SECOND, float),
    ("eval_loss", tm.EVAL_LOSS, float),  # -1 (skipped) until the quality gate's first evaluation
    ("eval_loss_delta", tm.EVAL_LOSS_DELTA, float),
)
WANTED = {metric for _, metric, _ in FIGURES} | {
    tm.START_STEP,
    tm.RECOVERY_SECONDS,
    tm.LAST_GOOD_CHECKPOINT_STEP,
    tm.QUARANTINE_STEPS,
    tm.QUARANTINE_SAMPLES,
}
#: Metrics read by one precision label: the step times an `auto` attempt measured, by candidate.
LABELLED = {tm.MEASURED_STEP_SECONDS: "candidate"}
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
#: A checkpoint's sha256 and precision as last_good_checkpoint labels them.
SHA256 = re.compile(r"^[0-9a-f]{64}$")
CHECKPOINT_PRECISIONS = ("fp8", *PRECISIONS)
#: A skipped step's label as quarantined_step writes it (a JSON-safe index, like MAX_VALUE).
STEP_LABEL = re.compile(r"^\d{1,15}$")
#: A moment as precision_change labels it: Unix seconds, or empty when the trainer said none.
MOMENT_LABEL = re.compile(r"^(\d{1,12}(\.\d{1,6})?)?$")
#: The most metric samples one exposition may hold before the rest is ignored.
MAX_SAMPLES = 10_000
#: The longest line parsed. The trainer's longest (a precision_change series, its message cut at
#: 512 characters, each escaped in at most two) stays under 2,048; prometheus_client's parser
#: takes time that grows with the square of a line's length (a 1 MiB line of labels: seconds of
#: the operator's CPU, on every read), so a longer line is dropped before it is parsed.
MAX_LINE = 4096
#: Figures beyond this are not readings (and no JSON number a status may hold exactly).
MAX_VALUE = 2.0**53


@dataclass(frozen=True)
class ListedSkip:
    """One quarantined_step series: the step it names, and its place in the trainer's listing."""

    place: float
    entry: SkippedStep


@dataclass
class Exposition:
    """What an exposition says that the status uses, each series parsed and checked."""

    #: The unlabelled figures (WANTED), by metric name.
    values: dict[str, float] = field(default_factory=dict)
    #: The LABELLED metrics' values by the precision they label.
    by_precision: dict[str, dict[Precision, float]] = field(default_factory=dict)
    #: The `precision` labels of the measured step times: the precision the attempt chose when
    #: it measured (the attempt's label then; a change in place moves only its other series).
    measured_in: set[Precision] = field(default_factory=set)
    #: The checkpoints last_good_checkpoint names with their sha256 (a scrape may catch two).
    checkpoints: list[CheckpointReading] = field(default_factory=list)
    #: The quarantine's listed steps, in the exposition's order.
    skips: list[ListedSkip] = field(default_factory=list)
    #: The fallbacks the processes made in place, by the attempt each began.
    changes: dict[int, InPlaceChange] = field(default_factory=dict)

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        """Keep one finite sample when its series is one the trainer writes."""
        if name in WANTED:
            self.values[name] = value
        elif name in LABELLED and (precision := _precision(labels.get(LABELLED[name]))) is not None:
            self.by_precision.setdefault(name, {})[precision] = value
            if name == tm.MEASURED_STEP_SECONDS and (chosen := _precision(labels.get("precision"))) is not None:
                self.measured_in.add(chosen)
        elif name == tm.LAST_GOOD_CHECKPOINT and (checkpoint := _checkpoint(labels, value)) is not None:
            self.checkpoints.append(checkpoint)
        elif name == tm.QUARANTINED_STEP and (entry := _skipped(labels)) is not None:
            self.skips.append(ListedSkip(value, entry))
        elif name == tm.PRECISION_CHANGE and (change := _changed(labels, value)) is not None:
            self.changes[change.attempt] = change


def parse(text: str) -> Exposition:
    """The exposition's series the status uses; at most MAX_SAMPLES samples are looked at, and
    no line longer than MAX_LINE."""
    found = Exposition()
    lines = text.split("\n")
    if any(len(line) > MAX_LINE for line in lines):
        log.debug("metrics lines longer than %d characters dropped", MAX_LINE)
        text = "\n".join(line for line in lines if len(line) <= MAX_LINE)
    try:
        for count, sample in enumerate(s for family in text_string_to_metric_families(text) for s in family.samples):
            if count >= MAX_SAMPLES:
                break
            value = sample.value
            if isinstance(value, float | int) and math.isfinite(value) and value < MAX_VALUE:
                found.add(sample.name, sample.labels, float(value))
    except Exception as exc:  # the parser raises what it likes on garbage: keep what came before
        log.debug("unparsable metrics: %r", exc)
    return found


def _precision(label: str | None) -> Precision | None:
    return next((p for p in PRECISIONS if p == label), None)


def _checkpoint(labels: dict[str, str], step: float) -> CheckpointReading | None:
    """A last_good_checkpoint series as the checkpoint it names, else None."""
    sha, precision = labels.get("sha256", ""), labels.get("checkpoint_precision", "")
    if SHA256.match(sha) and precision in CHECKPOINT_PRECISIONS and step > 0:
        return CheckpointReading(step=int(step), sha256=sha, precision=precision)
    return None


def _skipped(labels: dict[str, str]) -> SkippedStep | None:
    """A quarantined_step series as the skipped step it lists, else None."""
    step, cause, samples = (labels.get(name, "") for name in tm.QUARANTINED_STEP_LABELS)
    known, spans = next((c for c in CAUSES if c == cause), None), spans_of(samples)
    if STEP_LABEL.match(step) and known is not None and spans is not None:
        return SkippedStep(step=int(step), cause=known, samples=spans)
    return None


def _changed(labels: dict[str, str], seconds: float) -> InPlaceChange | None:
    """A precision_change series as the change it names (checked as a report's), else None."""
    fields: dict[str, str | None] = {name: labels.get(name, "") for name in ("attempt", *tm.PRECISION_CHANGE_LABELS)}
    if not all(STEP_LABEL.match(fields[name] or "") for name in ("attempt", "step", "start_step")):
        return None
    if not MOMENT_LABEL.match(fields["at"] or ""):
        return None
    fields["at"], fields["kind"] = fields["at"] or None, fields["kind"] or "fallback"  # a trainer that said neither
    try:
        return InPlaceChange.model_validate({**fields, "recovery_seconds": seconds})
    except ValidationError:
        return None
