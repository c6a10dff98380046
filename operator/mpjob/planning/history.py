"""The attempt history in the status: bounded entries, complete counts.

`status.attempts` keeps the first attempt (the precision the job began in) and the newest
ones, MAX_ATTEMPT_ENTRIES in all (more only while a chain of attempts begun in place in one Job
is longer: `bound`), so a job that is preempted a thousand times never brings its
status near etcd's object size limit (each entry is about a kilobyte). What the planner
decides on never depends on a dropped entry: `status.attemptCounts` counts every attempt
begun, every charged one, every re-promotion (and the precisions barred from another) and
every ending by reason. Indexes stay monotonic (`<job>-a<N>` names are never reused): the next
index is `started`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from mpjob_contract.api import (
    MAX_ATTEMPT_ENTRIES,
    AttemptCounts,
    AttemptStatus,
    MixedPrecisionJobStatus,
    RequestedPrecision,
)
from mpjob_contract.codes import Reason
from mpjob_contract.vocabulary import safer_than

#: Entries kept from the beginning of the history; the rest of MAX_ATTEMPT_ENTRIES are the newest.
KEEP_FIRST = 1
#: Before counts existed these endings used none of the budget (a status written then).
_UNCHARGED_BEFORE_COUNTS = frozenset({Reason.PREEMPTED.value, Reason.SUSPENDED.value})
#: Endings that bar a precision from re-promotion when they come after a re-promotion into it.
FAULTED = frozenset({Reason.NUMERIC_FAULT.value, Reason.NON_FINITE_IN_FP32.value})


def counts(status: MixedPrecisionJobStatus) -> AttemptCounts:
    """The job's attempt counts, made from its entries the first time (a status written before
    counts existed still holds every entry)."""
    if status.attempt_counts is None:
        ended = [a for a in status.attempts if a.finish_time is not None]
        by_reason: dict[str, int] = {}
        for attempt in ended:
            by_reason[attempt.reason or ""] = by_reason.get(attempt.reason or "", 0) + 1
        status.attempt_counts = AttemptCounts(
            started=max((a.index + 1 for a in status.attempts), default=0),
            charged=sum(1 for a in ended if _was_charged(a)),
            repromotions=sum(1 for a in status.attempts if a.repromoted),
            repromoted_at=repromoted_at(status.attempts),
            barred=sorted(barred(status.attempts)),
            by_reason=by_reason,
            out_of_memory_micro_batches=ran_out_of_memory(ended),
        )
    return status.attempt_counts


def ran_out_of_memory(attempts: Sequence[AttemptStatus], counts: AttemptCounts | None = None) -> dict[str, int]:
    """The smallest micro-batch an attempt ran out of device memory in, by its precision: of
    `attempts`, or of `counts` (an entry no longer in attempts[]). A status written before the
    precision was kept holds one for every precision instead (counts.outOfMemoryMicroBatch, read
    by `batch.largest_micro_batch`)."""
    smallest = dict(counts.out_of_memory_micro_batches) if counts is not None else {}
    for a in attempts:
        if a.reason == Reason.OUT_OF_DEVICE_MEMORY and a.micro_batch:
            smallest[a.precision] = min(smallest.get(a.precision, a.micro_batch), a.micro_batch)
    return smallest


def repromoted_at(attempts: Sequence[AttemptStatus], counts: AttemptCounts | None = None) -> dict[str, int]:
    """The first attempt each precision was re-promoted into: in `attempts`, or in `counts` (an
    entry no longer in attempts[])."""
    first = dict(counts.repromoted_at) if counts is not None else {}
    for a in attempts:
        if a.repromoted:
            first[a.precision] = min(first.get(a.precision, a.index), a.index)
    return first


def barred(attempts: Sequence[AttemptStatus], counts: AttemptCounts | None = None) -> frozenset[str]:
    """The precisions a re-promotion never goes back up to: each faulted again after the first
    re-promotion into it, as `attempts` (the planner may add the endings it foresees) and, for
    entries no longer in attempts[], `counts` show."""
    first = repromoted_at(attempts, counts)
    again = {a.precision for a in attempts if a.reason in FAULTED and a.index >= first.get(a.precision, a.index + 1)}
    return frozenset(again | set(counts.barred if counts is not None else ()))


def faulted_at(attempts: Sequence[AttemptStatus], index: int, precision: str, *, fallback: bool) -> int | None:
    """The step the precision a fallback in `precision` left faulted at (launch.repromoteCountsFrom): that of
    attempt `index` for the fallback after it; for a restart in its precision, that of the attempt the run of
    `precision` attempts `index` ends began by faulting (None: not known, or no fallback began it)."""
    by_index = {a.index: a for a in attempts}
    if fallback:
        return by_index[index].end_step if index in by_index else None
    while index in by_index and by_index[index].precision == precision:
        index -= 1
    before = by_index.get(index)
    fell_back = before is not None and before.reason in FAULTED and safer_than(precision, before.precision)
    return before.end_step if fell_back and before is not None else None


def first_trained(attempts: Sequence[AttemptStatus]) -> RequestedPrecision | None:
    """The precision the job first trained in (None: `attempts` lacks its first attempt): the first
    attempt's, or, when it ended before it measured its node (still `auto`), that of the first
    attempt after it that did, the ones between all kept; `auto` when none has measured yet (or an
    entry between was dropped: `bound`)."""
    chain = sorted(attempts, key=lambda a: a.index)
    if not chain or chain[0].index != 0:
        return None
    for expected, attempt in enumerate(chain):
        if attempt.index != expected:
            break
        if attempt.precision != "auto":
            return attempt.precision
    return chain[0].precision


def _was_charged(attempt: AttemptStatus) -> bool:
    if attempt.charged is not None:
        return attempt.charged
    return attempt.reason not in _UNCHARGED_BEFORE_COUNTS


def next_index(status: MixedPrecisionJobStatus) -> int:
    """The index of the next new attempt: one past every attempt ever begun."""
    return counts(status).started


def used(status: MixedPrecisionJobStatus) -> int:
    """Attempts that used runPolicy.maxAttempts so far."""
    return counts(status).charged


def started(status: MixedPrecisionJobStatus, entry: AttemptStatus) -> None:
    """Count a new attempt's entry and add it, dropping the oldest beyond the bound."""
    tally = counts(status)
    tally.started = max(tally.started, entry.index + 1)
    tally.repromotions += 1 if entry.repromoted else 0
    tally.repromoted_at = repromoted_at([entry], tally)
    status.attempts.append(entry)
    bound(status)


def ended(status: MixedPrecisionJobStatus, entry: AttemptStatus, *, charged: bool) -> None:
    """Count an attempt's ending (the caller ends each attempt once)."""
    tally = counts(status)
    reason = entry.reason or ""
    tally.by_reason[reason] = tally.by_reason.get(reason, 0) + 1
    tally.charged += 1 if charged else 0
    entry.charged = charged
    tally.barred = sorted(barred([entry], tally))
    tally.out_of_memory_micro_batches = ran_out_of_memory([entry], tally)


def reopened(status: MixedPrecisionJobStatus, entry: AttemptStatus) -> None:
    """Take back `entry`'s ending, and its count (`ended`), as if it still ran: what it did before
    its recorded ending is to be recorded first (`late`). Only an ending that bars no precision
    and ran out of no memory (an operator's own: a suspension, a stall, a resize, a deadline, a
    node lost)."""
    tally, reason = counts(status), entry.reason or ""
    tally.by_reason[reason] = tally.by_reason.get(reason, 1) - 1
    if not tally.by_reason[reason]:
        del tally.by_reason[reason]
    tally.charged -= 1 if entry.charged is not False else 0
    entry.reason = entry.exit_code = entry.end_step = entry.finish_time = entry.charged = None
    entry.message = None


def withdrawn(status: MixedPrecisionJobStatus, entry: AttemptStatus) -> AttemptStatus:
    """Take the newest entry, begun but never run (no Job made for it), out of the history and its
    count (`started`), to be begun again under another index (`late`); the entry."""
    tally = counts(status)
    status.attempts = [a for a in status.attempts if a is not entry]
    tally.started = min(tally.started, entry.index)
    if entry.repromoted:
        tally.repromotions -= 1
        if tally.repromoted_at.get(entry.precision) == entry.index:
            del tally.repromoted_at[entry.precision]
    return entry


def bound(status: MixedPrecisionJobStatus) -> None:
    """Keep the first KEEP_FIRST entries and the newest, MAX_ATTEMPT_ENTRIES in all; only
    ended entries are ever dropped, and never one a later entry runs in (begun in place): the
    first of a chain holds its Job's UID (`jobUid`, by which a restarted operator knows the Job
    and what it left as its own) and `job_index` walks the chain to it, so a chain longer than
    the bound stays whole until its last entry goes (then all of it may go at once)."""
    extra = len(status.attempts) - MAX_ATTEMPT_ENTRIES
    if extra <= 0:
        return
    by_index = {a.index: a for a in status.attempts}
    dropped: list[AttemptStatus] = []
    for entry in reversed(status.attempts[KEEP_FIRST : KEEP_FIRST + extra]):  # newest first: a host after its guest
        guest = by_index.get(entry.index + 1)
        hosts = guest is not None and guest.in_place and all(guest is not d for d in dropped)
        if entry.finish_time is not None and not hosts:
            dropped.append(entry)
    status.attempts = [a for a in status.attempts if all(a is not d for d in dropped)]
    counts(status).omitted += len(dropped)


def job_index(status: MixedPrecisionJobStatus, index: int) -> int:
    """The attempt whose Job attempt `index` runs in: itself, or for one begun in place
    (spec.precision.inPlace), the first attempt of its chain of in-place changes; once a Job was
    made for an attempt begun in place (its Job deleted while it ran: its own jobUid), that one."""
    by_index = {a.index: a for a in status.attempts}
    while (entry := by_index.get(index)) is not None and entry.in_place and not entry.job_uid and index - 1 in by_index:
        index -= 1
    return index


def lineage(status: MixedPrecisionJobStatus, index: int) -> dict[int, list[str]]:
    """The Jobs each attempt before `index` that `status` holds ran in (their UIDs, oldest first:
    those made before its newest, deleted while it ran, then the newest; none recorded: empty; an
    attempt begun in place, its chain's, then its own: `_ran_in`), by attempt: the writers whose checkpoints attempt
    `index` may resume from (AttemptLaunch.lineage). A stray Job, made for an attempt after it
    ended, is never one recorded (`strays`, `own`), so its checkpoints are not resumed from."""
    recorded = {a.index: [*(a.former_job_uids or []), *([a.job_uid] if a.job_uid else [])] for a in status.attempts}
    return {a.index: _ran_in(status, a, recorded) for a in status.attempts if a.index < index}


def _ran_in(status: MixedPrecisionJobStatus, entry: AttemptStatus, recorded: dict[int, list[str]]) -> list[str]:
    """The Jobs (`recorded`, by attempt) attempt `entry` ran in: its Job's (`job_index`), and for
    one begun in place that has Jobs of its own since, first those of the Job it began in."""
    own = job_index(status, entry.index)
    began = job_index(status, entry.index - 1) if own == entry.index and entry.in_place else None
    return [*(recorded.get(began, []) if began is not None else []), *recorded.get(own, [])]


class HeldJob(NamedTuple):
    """An attempt Job the operator holds: its UID and its metadata.creationTimestamp (None: none
    that reads), the API server's own evidence of when it was made."""

    uid: str
    created: str | None = None


def strays(status: MixedPrecisionJobStatus, jobs: Mapping[int, HeldJob]) -> dict[int, str]:
    """Of the attempt Jobs held (`jobs`: by attempt, the Job of its name that this job controls),
    the UIDs of those that are not the job's, by attempt (`stray`)."""
    by_index = {a.index: a for a in status.attempts}
    return {index: job.uid for index, job in jobs.items() if stray(by_index.get(index), job) is True}


def own(status: MixedPrecisionJobStatus, jobs: Mapping[int, HeldJob]) -> dict[int, str]:
    """Of the attempt Jobs held (as `strays`), the UIDs the reconcile may record on their entries
    as their attempts' own (`lifecycle.made`), by attempt (`stray`)."""
    by_index = {a.index: a for a in status.attempts}
    return {index: job.uid for index, job in jobs.items() if stray(by_index.get(index), job) is False}


def stray(entry: AttemptStatus | None, job: HeldJob) -> bool | None:
    """Whether `job`, held for attempt `entry`, is a stray (None: neither a stray nor its own).
    A stray is of an attempt the status has ended whose recorded Job (`jobUid`) is another one,
    or that records none and ended before the Job was made (`made_late`): made by an operator
    that stalled between recording the attempt and making its Job and woke once another had
    gone past it, its trainers would write the job's checkpoints beside the running attempt's.
    An ended entry that records no Job is otherwise no evidence: a status written before jobUid
    existed records none, and the Jobs it kept were made before their attempts ended (their
    own). One whose making is unknown is neither deleted nor recorded (its checkpoints stay out
    of the lineage). A Job of the attempt that has not ended is its own, its uid recorded or not
    (made, that write not held yet); so is one of an entry dropped from the history (`bound`:
    it is retired as an older attempt's; `status.record_job_uids` finds no entry to record)."""
    if entry is None or entry.finish_time is None:
        return False
    if entry.job_uid:
        return entry.job_uid != job.uid
    return made_late(entry, job)


def made_late(entry: AttemptStatus, job: HeldJob) -> bool | None:
    """Whether `job` was made after its attempt `entry` ended (None: unknown: no time that reads).
    Both moments are whole seconds (Kubernetes stamps creationTimestamp so, the status its
    finishTime: `status.stamp`), truncated: a Job made in the second its attempt ended is not
    late. That second cannot order them, and a Job made in its attempt's own run is the usual
    order (made, then ended: at once, say, refused or suspended), while a stalled operator
    waking within the very second another ended that attempt is not; and a Job wrongly deleted
    cannot be made again. finishTime is the operator's clock, creationTimestamp the API
    server's: they are taken to agree within that second (nodes kept in time, NTP); a skew moves
    the boundary by as much."""
    end, made = _second(entry.finish_time), _second(job.created)
    return None if end is None or made is None else made > end


def _second(value: str | None) -> datetime | None:
    """The moment `value` (RFC 3339) names, to the whole second (in UTC if it names no zone)."""
    try:
        moment = datetime.fromisoformat(value) if value else None
    except ValueError:
        return None
    return None if moment is None else moment.replace(microsecond=0, tzinfo=moment.tzinfo or UTC)


def current(status: MixedPrecisionJobStatus, index: int) -> bool:
    """Whether attempt `index` is the job's current one: its newest, not ended."""
    newest = status.attempts[-1] if status.attempts else None
    return newest is not None and newest.index == index and newest.finish_time is None
