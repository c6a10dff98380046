"""What a job did, in a few lines: the summary `mpjob run` prints at its end and `mpjob status`
prints for a job on a cluster (attempts, skips, recoveries, the last checkpoint, cost)."""

from __future__ import annotations

from datetime import datetime

from mpjob.planning import repeat
from mpjob.planning.history import KEEP_FIRST
from mpjob.planning.status import FINISHED, WAITS, ConditionReason, ConditionType, failed_condition, moment
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.skipping import Skipped, describe_ranges, describe_steps


def summary_lines(name: str, status: MixedPrecisionJobStatus, now: datetime | None = None) -> list[str]:
    """The job's phase and precision, one line per attempt, then skips, checkpoint and cost; at
    `now`, a running attempt's line says how long ago its step last moved."""
    precision = f" in {status.precision}" if status.precision else ""  # none before a first attempt
    lines = [f"{name}: {status.phase}{precision} at step {status.step}{failed_because(status)}"]
    resized = len({a.world_size for a in status.attempts}) > 1  # spec.elastic changed the job's size
    # Out of memory, or a fallback into fp32, split the micro-batch (a resize's split follows its size).
    split = not resized and len({(a.micro_batch, a.grad_accumulation) for a in status.attempts}) > 1
    lines += [attempt_line(a, world=resized, shape=split, now=now) for a in status.attempts]
    lines += refused_lines(status)
    lines += trouble_lines(status)
    if count := recoveries(status):
        lines.append(f"  recoveries: {count} ({precision_path(status)})")
    if status.skipped:
        lines.append(skipped_line(status.skipped))
    if status.last_checkpoint:
        ck = status.last_checkpoint
        lines.append(f"  last checkpoint: step {ck.step} ({ck.precision}) sha256 {ck.sha256[:16]}")
    if status.cost and (status.cost.gpu_seconds or status.cost.wasted_steps):
        lines.append(cost_line(status))
    return lines


def failed_because(status: MixedPrecisionJobStatus) -> str:
    """Why a Failed job stopped trying, from its Failed condition (' (FailedAtTheSameStep)',
    ' (AttemptsExhausted)': a job that failed in two of its six attempts says why); else ''."""
    failed = failed_condition(status)
    return f" ({failed.reason})" if status.phase == "Failed" and failed is not None and failed.reason else ""


def refused_lines(status: MixedPrecisionJobStatus) -> list[str]:
    """The Failed condition's message of a job that failed before any attempt (a spec the
    operator refused: InvalidSpec), which no attempt's line holds: the field at fault; else none."""
    failed = failed_condition(status)
    if status.phase != "Failed" or status.attempts or failed is None or not failed.message:
        return []
    return [f"  failed: {one_line(failed.message)}"]


#: Conditions (type, status) that say why a job that has not ended waits, or what goes wrong while it runs.
TROUBLE = frozenset(
    {*((kind, waits) for kind, (waits, _) in WAITS.items()), (ConditionType.CHECKPOINTS_FAILING, "True")}
)
#: Running=False reasons of a job that waits for something other than its pods to start.
WAITING = frozenset(
    {ConditionReason.BACKING_OFF, ConditionReason.AWAITING_ADMISSION, ConditionReason.AWAITING_READMISSION}
)


def trouble_lines(status: MixedPrecisionJobStatus) -> list[str]:
    """One line per condition that says why a job not ended waits or what goes wrong (its pods
    not created or not scheduled, a backoff, its queue, checkpoints failing); none once ended."""
    if status.phase in FINISHED:
        return []
    return [
        f"  {c.type}: {one_line(c.message)}"
        for c in status.conditions
        if (c.type, c.status) in TROUBLE
        or (c.type == ConditionType.RUNNING and c.status == "False" and c.reason in WAITING)
    ]


#: Endings whose next attempt is no recovery: the user's stop (Ctrl-C, runPolicy.suspend) and its
#: resume, a growth at a checkpoint (spec.elastic), a re-promotion to the faster precision.
NOT_RECOVERED = frozenset({Reason.SUSPENDED, Reason.SCALED_UP, Reason.REPROMOTE})


def recoveries(status: MixedPrecisionJobStatus) -> int:
    """The attempts begun after one ended by a fault, a failure or the cluster (a fallback, a
    retry, a resume after a preemption, a shrink), counted over every attempt (attemptCounts:
    attempts[] keeps only the first and the newest) or, without counts, over the entries."""
    counts = status.attempt_counts
    if counts is None or counts.started == 0:
        return sum(1 for a in status.attempts[:-1] if a.reason not in NOT_RECOVERED)
    newest = status.attempts[-1] if status.attempts else None
    last_has_none = newest is not None and newest.reason in NOT_RECOVERED  # nothing began after it
    not_recovered = sum(counts.by_reason.get(reason, 0) for reason in NOT_RECOVERED) - last_has_none
    return max(0, counts.started - 1 - not_recovered)


def precision_path(status: MixedPrecisionJobStatus) -> str:
    """The precisions the job trained in, each change once (fallbacks and re-promotions: 'fp16 ->
    bf16'), or 'all in fp16' when none changed; '...' where attempts[] dropped entries (after
    its first), whose precisions are not known."""
    omitted = status.attempt_counts.omitted if status.attempt_counts else 0
    names: list[str] = [a.precision for a in status.attempts]
    if omitted and names:
        names.insert(KEEP_FIRST, "...")
    path = [name for i, name in enumerate(names) if i == 0 or name != names[i - 1]]
    return f"all in {path[0]}" if len(path) == 1 else " -> ".join(path)


def attempt_line(a: AttemptStatus, *, world: bool = False, shape: bool = False, now: datetime | None = None) -> str:
    """One attempt; with `world`, the processes it ran on (a job whose size changed); with
    `shape`, its micro-batch split (a job whose split changed); at `now`, how long ago the step
    of one still running last moved (its progressTime: runPolicy.progressDeadlineSeconds)."""
    end = a.end_step if repeat.end_known(a) else "?"  # unknown: still running, or a report without progress
    steps = f"steps {a.start_step}-{end}"
    if a.reason == Reason.SUSPENDED and repeat.before_first_step(a):  # the user's stop, where it began
        steps = f"step {a.start_step}, stopped before training"
    said = f" ({one_line(a.message)})" if a.message and a.reason != Reason.SUCCEEDED else ""
    how = " in place" if a.in_place else ""
    back = f", back in {a.recovery_seconds:.2f} s{how}" if a.recovery_seconds is not None else how
    on = f" on {a.world_size} process(es)" if world and a.world_size else ""
    if shape and a.micro_batch is not None:
        on += f" micro-batch {a.micro_batch} x {a.grad_accumulation}"
    ended = a.reason or running(a, now)
    return f"  attempt {a.index}: {a.precision}{on} {steps}{back} {ended}{said}"


#: The most of an attempt's message its summary line shows (the status holds all of it).
SUMMARY_MESSAGE_CHARS = 400
_CUT = " [...] "


def one_line(message: str) -> str:
    """`message` on one line (a quoted stderr's lines joined by ' | ', blank ones left out), at
    most SUMMARY_MESSAGE_CHARS: a longer one keeps its beginning and its end (a traceback's
    error), the middle cut."""
    flat = " | ".join(part.strip() for part in message.splitlines() if part.strip())
    if len(flat) <= SUMMARY_MESSAGE_CHARS:
        return flat
    half = (SUMMARY_MESSAGE_CHARS - len(_CUT)) // 2
    return flat[:half].rstrip() + _CUT + flat[-half:].lstrip()


def running(a: AttemptStatus, now: datetime | None) -> str:
    """'running', and how long ago its step last moved when `now` and its progressTime say."""
    moved = moment(a.progress_time)
    if now is None or moved is None or a.finish_time is not None:
        return "running"
    return f"running, its step last moved {max(0.0, (now - moved).total_seconds()):.0f} s ago"


def skipped_line(skipped: Skipped) -> str:
    """'  skipped: 1 step(s), 1 sample(s): step 5 (data: 30)' for the summary (steps counted from 1);
    a listing the record cut short (its bounds: mpjob_contract.skipping) says how much it lists,
    so a step's first samples are not taken for all of them."""
    shown = ", ".join(
        f"step {describe_steps([s.step])} ({s.cause}: {describe_ranges(s.samples) or 'whole step'})"
        for s in skipped.steps
    )
    samples = sum(r.last - r.first + 1 for s in skipped.steps for r in s.samples)
    cut = [(len(skipped.steps), skipped.count, "steps"), (samples, skipped.samples if samples else 0, "samples")]
    listed = " and ".join(f"{n} {what}" for n, total, what in cut if n < total)
    counts = f"{skipped.count} step(s), {skipped.samples} sample(s)" + (f", {listed} listed" if listed else "")
    return f"  skipped: {counts}: {shown}"


def cost_line(status: MixedPrecisionJobStatus) -> str:
    """What the job cost: GPU-seconds and those wasted, and the steps trained again (the only
    cost a job that trained on no GPU has)."""
    cost = status.cost
    assert cost is not None
    if not cost.gpu_seconds:
        return f"  cost: {cost.wasted_steps} steps trained again, no GPU-seconds charged"
    money = f", {cost.amount:.2f} {cost.currency} ({cost.wasted_amount or 0:.2f} wasted)" if cost.amount else ""
    return (
        f"  cost: {cost.gpu_seconds:.0f} GPU-seconds, {cost.wasted_gpu_seconds:.0f} wasted "
        f"({cost.wasted_steps} steps trained again){money}"
    )
