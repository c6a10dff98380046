"""Changes in place heard late: made by the trainer of an attempt the operator then ended on its
own word while its ranks ran (`cutoff.HEARD_LATE`: a suspension, a stall, a resize, the job's
deadline, a node lost), after the last read of its metrics, so the ending recorded at once cannot know of
them. The report its pods leave once they stop lists them (`cutoff.heard`).

They are recorded as a read would have recorded them, by the same rules (`changed.record`,
`lifecycle.conclude`): the ended attempt is taken back to running, its changes end it and begin
the next in place, and the operator's ending, as recorded, moves to the last one begun. An
attempt already planned to follow (a stall's, a resize's; its Job not made yet: `heard` waits for
that) goes on in the precision and split that one went on in, numbered after it. Left as it was,
the job resumed in the precision that had faulted (to fault and fall back again), and its history
lacked the attempt that ran.

The phase and the Running condition stay as the ending left them: a suspended job stays
suspended, a failed one failed; what the changes say on the way (the fallback's Event and its
condition) is said."""

from __future__ import annotations

from dataclasses import dataclass

from mpjob.planning import changed, history
from mpjob.planning import status as st
from mpjob.planning.batch import BatchShape, held
from mpjob.planning.elastic import shape_of, workers_of
from mpjob.planning.plan import Plan, When
from mpjob.planning.status import ConditionType
from mpjob_contract.api import AttemptStatus, Condition, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.report import InPlaceChange
from mpjob_contract.vocabulary import settled


@dataclass(frozen=True)
class Ending:
    """How the operator ended an attempt, as recorded (`st.end_attempt`'s arguments)."""

    reason: str
    exit_code: int | None
    message: str
    finish_time: str | None
    charged: bool

    @classmethod
    def of(cls, entry: AttemptStatus) -> Ending:
        charged = entry.charged is not False
        return cls(entry.reason or "", entry.exit_code, entry.message or "", entry.finish_time, charged)


def recorded(
    plan: Plan, spec: MixedPrecisionJobSpec, ended: AttemptStatus, changes: list[InPlaceChange], when: When
) -> AttemptStatus:
    """Record the `changes` that began attempts after `ended` (ended while its ranks ran) and end
    the last one begun as `ended` was ended; the attempt that ends now (`ended` when none did)."""
    late = [c for c in changes if c.attempt > ended.index]
    if not late or late[0].attempt != ended.index + 1:
        return ended
    if late[0].from_precision != settled(ended.precision, late[0].from_precision):
        return ended  # not what this attempt trained in: another attempt's
    status, ending = plan.status, Ending.of(ended)
    phase, message, running = status.phase, status.message, _condition(plan, ConditionType.RUNNING)
    planned = [history.withdrawn(status, a) for a in reversed(status.attempts) if a.index > ended.index][::-1]
    history.reopened(status, ended)
    changed.record(plan, spec, late, when)
    plan.create.clear()
    last = status.attempts[-1]
    if last.finish_time is not None:  # a change ended the job (no attempt left for it): it stands
        return last
    st.end_attempt(status, last.index, ending.reason, ending.exit_code, ending.message, last.start_step,
                   ending.finish_time, charged=ending.charged)  # fmt: skip
    status.phase, status.message = phase, message
    if running is not None:
        status.conditions = [running if c.type == running.type else c for c in status.conditions]
    for entry in planned:
        _follows(spec, status, entry, ended.precision, last)
    return last


def _follows(
    spec: MixedPrecisionJobSpec,
    status: MixedPrecisionJobStatus,
    entry: AttemptStatus,
    faulted: str,
    last: AttemptStatus,
) -> None:
    """`entry`, planned after the ending `last` now holds, numbered after it and, when planned in
    the precision that faulted, in the precision and split `last` went on in; planned at another
    size (a resize's), its own split held to what that precision may take (`batch.held`, as a
    fallback's is): `last`'s split on `last`'s workers would not keep the global batch there."""
    entry.index = history.next_index(status)
    if entry.precision == faulted:
        split = last.micro_batch, last.grad_accumulation
        if (workers := workers_of(spec, entry)) != workers_of(spec, last):
            planned = shape_of(entry) or BatchShape.of(spec)
            shape = held(spec, last.precision, planned, workers, status.attempts, history.counts(status))
            split = shape.micro_batch, shape.grad_accumulation
        entry.precision, (entry.micro_batch, entry.grad_accumulation) = last.precision, split
    history.started(status, entry)
    status.attempt, status.precision = entry.index, entry.precision


def _condition(plan: Plan, kind: ConditionType) -> Condition | None:
    return next((c.model_copy() for c in plan.status.conditions if c.type == kind), None)
