"""Skipping bad data and loss spikes: the spec's knobs (precision.guard.onBadData,
maxSkippedSteps, spike) and what a run skipped (the termination report's `skipped` and
status.skipped).

A step the fp32 replay finds non-finite in fp32 too is bad data: the attempt rolls back to the
last good checkpoint, quarantines that step's samples and goes on in the same precision. A
finite loss far above its running window (guard.spike) is treated the same way. Both are
bounded by guard.maxSkippedSteps; past it the attempt fails as a data fault, naming the steps.

The record is bounded (it travels in a 4 KiB termination report and a status patch): the count
and the samples' count are exact, the lists keep the first MAX_SKIPPED_ENTRIES entries.

While the attempt runs the same record reaches the operator through the trainer's metrics
endpoint (metrics.QUARANTINED_STEP): a listed step is one series whose labels carry its step,
cause and sample ranges, written by `spans_label` and read back by `spans_of`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

#: Skipped steps (and sample ranges) a report or status lists at most.
MAX_SKIPPED_ENTRIES = 16
#: The largest count, step or sample index a record holds: what a JSON number holds exactly. A
#: report is the tenant's word, and a larger figure in status.skipped is one the API server
#: refuses as not an integer, so every status patch of the job would fail with it.
MAX_RECORDED = 2**53 - 1
Recorded = Annotated[int, Field(ge=0, le=MAX_RECORDED)]
#: Why a step was skipped: the fp32 replay blamed its data, or its loss spiked.
SkipCause = Literal["data", "spike"]
CAUSES: tuple[SkipCause, ...] = get_args(SkipCause)
OnBadData = Literal["fail", "skip"]


class _Wire(BaseModel):
    """camelCase on the wire, unknown fields refused: the API's convention (api.ApiModel)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class SpikeSpec(_Wire):
    """guard.spike: what a finite loss spike does."""

    action: Literal["rollback", "none", "off"] = Field(
        "none",
        description="rollback: a finite loss whose z-score over the last `window` accepted losses exceeds "
        "`zScore` rolls back to the last good checkpoint and skips the spiking steps (bounded by "
        "maxSkippedSteps). none by default: a spike is finite, the run would finish anyway, and a false "
        "positive silently drops good data; turn it on for long runs where a spike costs more than a rollback. "
        '"off" is the former name of none, still read (YAML reads an unquoted off as false).',
    )
    z_score: float = Field(6.0, gt=0, le=1000, description="How many standard deviations above the window's mean.")
    window: int = Field(
        128, ge=8, le=4096, description="Accepted losses the mean and deviation are taken over; no check before."
    )


class SampleRange(_Wire):
    """Dataset indices first..last (inclusive), all skipped."""

    first: Recorded
    last: Recorded


class SkippedStep(_Wire):
    """One skipped optimizer step (0-based index) and why."""

    step: Recorded
    cause: SkipCause
    #: The samples it skipped (dataset indices, as ranges; empty: the loop named none).
    samples: list[SampleRange] = Field(default_factory=list, max_length=MAX_SKIPPED_ENTRIES)


class Skipped(_Wire):
    """What a run skipped so far (the quarantine): counts exact, the list bounded."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    count: Recorded = Field(0, description="Steps skipped.")
    samples: Recorded = Field(0, description="Samples skipped.")
    steps: list[SkippedStep] = Field(default_factory=list, max_length=MAX_SKIPPED_ENTRIES)


def ranges(indices: list[int]) -> list[SampleRange]:
    """Sorted indices as inclusive ranges (the first MAX_SKIPPED_ENTRIES)."""
    out: list[SampleRange] = []
    for index in sorted(set(indices)):
        if out and out[-1].last == index - 1:
            out[-1].last = index
        elif len(out) == MAX_SKIPPED_ENTRIES:
            break
        else:
            out.append(SampleRange(first=index, last=index))
    return out


def describe_steps(indices: Iterable[int]) -> str:
    """'13, 14' for the 0-based step indices 12 and 13: messages count steps from 1, as the log
    lines do (docs/sdk.md); events, reports, metric labels and status keep 0-based indexes."""
    return ", ".join(str(index + 1) for index in indices)


def describe_ranges(spans: list[SampleRange]) -> str:
    """'3, 7-9' for the ranges (what events and messages say)."""
    return ", ".join(str(r.first) if r.first == r.last else f"{r.first}-{r.last}" for r in spans)


#: The longest `samples` label a reader accepts (MAX_SKIPPED_ENTRIES ranges of 16-digit indices).
MAX_SPANS_LABEL = MAX_SKIPPED_ENTRIES * 34
_SPAN = re.compile(r"^(\d{1,16})(?:-(\d{1,16}))?$")


def spans_label(spans: list[SampleRange]) -> str:
    """'3,7-9': the ranges as one metric label value ("" for a step whose loop named none)."""
    return ",".join(str(r.first) if r.first == r.last else f"{r.first}-{r.last}" for r in spans)


def spans_of(label: str) -> list[SampleRange] | None:
    """The ranges a `spans_label` value names; None for anything it could not have written (an
    endpoint is the pod's: checked, never trusted)."""
    if len(label) > MAX_SPANS_LABEL:
        return None
    spans: list[SampleRange] = []
    for part in label.split(",") if label else []:
        match = _SPAN.match(part)
        if match is None or len(spans) == MAX_SKIPPED_ENTRIES:
            return None
        first, last = int(match[1]), int(match[2] or match[1])
        if not first <= last <= MAX_RECORDED:
            return None
        spans.append(SampleRange(first=first, last=last))
    return spans
