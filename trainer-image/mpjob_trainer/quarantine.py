"""Quarantine: the samples (or, when the loop names none, the steps) a run never trains on.

The data rung (session.skipping) adds to it when the fp32 replay blames a step's data or a
loss spikes; a loop learns from it which samples to leave out (`run.quarantined`, and
StepSampler does it for the builtin loop). It is part of every checkpoint (TrainingState holds
it under the reserved key `quarantine`), so a resumed attempt never serves a quarantined
sample again and the data order stays a function of the step: exact resume still holds.

Invariants: it only grows within a run; loading a checkpoint's quarantine merges it into what
this process already knows (a rollback to an older checkpoint keeps what was learnt since);
`version` goes up with every change, so a loader that collates ahead knows to start over.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from mpjob_contract.skipping import CAUSES, MAX_SKIPPED_ENTRIES, SkipCause, Skipped, SkippedStep, ranges

#: What a termination report lists at most (it must stay under Kubernetes' 4 KiB).
REPORT_STEPS = 8
REPORT_RANGES = 4
#: Narrows a step's samples to the ones whose fp32 loss is non-finite on their own.
ScreenFunction = Callable[[list[int]], list[int]]


@dataclass(frozen=True)
class SkipRecord:
    """One skipped optimizer step (0-based), why, and its samples (empty: the loop named none)."""

    step: int
    cause: SkipCause
    samples: tuple[int, ...] = field(default=())
    #: A step skipped whole: the samples it held (all ranks'; 0 when its loop did not say).
    whole: int = 0

    @property
    def size(self) -> int:
        """The samples this skip kept out of training."""
        return len(self.samples) or self.whole


class Quarantine:
    def __init__(self) -> None:
        self.records: list[SkipRecord] = []
        self._samples: set[int] = set()
        self._whole_steps: set[int] = set()
        self.version = 0
        #: The loop's screen (optional): which of a bad step's samples are non-finite alone, in
        #: fp32. Without one the whole step's samples are quarantined.
        self.screen: ScreenFunction | None = None
        #: Told of every change, a checkpoint's records merged in included (the data rung shows
        #: the quarantine on the metrics endpoint, where the operator reads it while the run goes on).
        self.watcher: Callable[[], None] | None = None

    # ---------------------------------------------------------------- what a loop asks
    @property
    def samples(self) -> frozenset[int]:
        """Dataset indices never to train on again."""
        return frozenset(self._samples)

    @property
    def steps(self) -> list[int]:
        """Skipped optimizer steps (0-based), in the order they were skipped."""
        return [r.step for r in self.records]

    def __contains__(self, index: object) -> bool:
        return index in self._samples

    def __len__(self) -> int:
        return len(self.records)

    def keep(self, indices: Iterable[int]) -> list[int]:
        """`indices` without the quarantined ones, in order."""
        return [i for i in indices if i not in self._samples]

    def skips_step(self, step: int) -> bool:
        """Is optimizer step `step` (0-based) skipped whole (its loop could not name samples)?"""
        return step in self._whole_steps

    def served_again(self, cause: SkipCause) -> set[int]:
        """The skipped steps a step judged for `cause` must not be: its re-run could only have served
        quarantined samples again. For bad data every skipped step (as judged, its bad samples are out); for a
        spike those skipped with all their samples (a spike's, or whole): one skipped for bad data, narrowed by
        the screen to some, still trains on the rest, which may spike."""
        return {r.step for r in self.records if cause == "data" or r.cause == "spike" or not r.samples}

    # ---------------------------------------------------------------- the rung adds
    def add(self, step: int, cause: SkipCause, samples: Iterable[int] = (), *, whole: int = 0) -> SkipRecord:
        """Skip step `step`: its `samples`, or (none named) the step whole, which held `whole` samples."""
        named = tuple(sorted(set(samples)))
        record = SkipRecord(step, cause, named, 0 if named else whole)
        self.records.append(record)
        if record.samples:
            self._samples.update(record.samples)
        else:
            self._whole_steps.add(step)
        self.version += 1
        if self.watcher is not None:
            self.watcher()
        return record

    def summary(self, *, steps: int = MAX_SKIPPED_ENTRIES, spans: int = MAX_SKIPPED_ENTRIES) -> Skipped:
        """The bounded record for status and reports: exact counts, the first `steps` entries."""
        listed = [
            SkippedStep(step=r.step, cause=r.cause, samples=ranges(list(r.samples))[:spans])
            for r in self.records[:steps]
        ]
        whole = sum(r.whole for r in self.records)  # a sample skipped by name counts once, a whole step's each time
        return Skipped(count=len(self.records), samples=len(self._samples) + whole, steps=listed)

    def reported(self) -> Skipped | None:
        """The termination report's record of what was skipped (None: nothing), within its bounds."""
        return self.summary(steps=REPORT_STEPS, spans=REPORT_RANGES) if self.records else None

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """weights_only-safe: lists of ints and strings; [step, cause, samples], and a step skipped
        whole with a known size [step, cause, [], size]."""
        return {"records": [[r.step, r.cause, list(r.samples), *([r.whole] if r.whole else [])] for r in self.records]}

    @staticmethod
    def state_problem(state: Any) -> str | None:
        """What makes a checkpoint's quarantine unusable (None: nothing): records not as
        `state_dict` writes them. Checked before anything is loaded: a merge never stops midway."""
        records = state.get("records", []) if isinstance(state, dict) else None
        if not isinstance(records, list):
            return "a quarantine whose records are no list"
        for record in records:
            if not _well_formed(record):
                return f"a quarantine record {record!r:.80}"
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Merge a checkpoint's quarantine (`state_problem` checked it) into this one (see the
        invariants above)."""
        known = {(r.step, r.cause) for r in self.records}
        for step, cause, samples, *whole in state.get("records", []):
            if (int(step), str(cause)) not in known:
                self.add(int(step), cause, [int(i) for i in samples], whole=int(whole[0]) if whole else 0)


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _well_formed(record: Any) -> bool:
    """[step, cause, samples] or [step, cause, [], size], as Quarantine.state_dict writes them."""
    if not isinstance(record, list) or len(record) not in (3, 4):
        return False
    step, cause, samples, *whole = record
    counts = _count(step) and all(_count(size) for size in whole)
    return counts and cause in CAUSES and isinstance(samples, list) and all(_count(i) for i in samples)
