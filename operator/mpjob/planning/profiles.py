"""Profiles on demand, decided: what the `mpjob.dev/profile-steps` annotation, the job's status
and the trainer's last answer change in status.profiles, which Events say so, and what to ask
the running attempt's rank 0. Pure; `controller/profiles.py` reads and acts.

The rules, written once here:
- a value is asked once: it is recorded as a new entry when it differs from the newest entry's
  request (setting the same value again asks nothing; a new value asks again);
- a bad value (not a whole number of steps from 1 to MAX_PROFILE_STEPS) is recorded Refused
  with a Warning Event naming the annotation, and nothing is asked (annotations are not
  checked by the API server's schema);
- a good value is asked of the running attempt; while the job has no running attempt it waits
  (Pending, Recovering), and a finished job refuses it;
- an entry in flight is asked again on every tick (the trainer answers, never repeats an id)
  until the trainer's answer is final, or its attempt ended first (Failed);
- the path is the operator's own (`profile_dir`), never the pod's word.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from enum import StrEnum

from mpjob.planning.plan import Event
from mpjob.planning.status import FINISHED
from mpjob_contract.api import MixedPrecisionJobStatus
from mpjob_contract.tracking import (
    FINAL_STATES,
    MAX_PROFILE_ENTRIES,
    TRACE_FILE,
    BadProfileRequest,
    ProfileAnswer,
    ProfileStatus,
    profile_dir,
    profile_steps,
)


class ProfileReason(StrEnum):
    """The Events' reasons of profiles on demand."""

    REQUESTED = "ProfileRequested"
    REFUSED = "ProfileRefused"


@dataclass(frozen=True)
class ProfileAsk:
    """Ask the running attempt's rank 0 for profile `id` of `steps` steps."""

    id: int
    steps: int
    attempt: int


@dataclass
class ProfilePlan:
    profiles: list[ProfileStatus]
    events: list[Event] = field(default_factory=list)
    ask: ProfileAsk | None = None


def plan_profiles(
    status: MixedPrecisionJobStatus,
    annotation: str | None,
    *,
    checkpoint_dir: str,
    now: str,
    answer: ProfileAnswer | None = None,
) -> ProfilePlan:
    """status.profiles after the annotation and the trainer's `answer`, and what to ask next."""
    plan = ProfilePlan([p.model_copy() for p in status.profiles])
    running = status.attempts[-1].index if status.phase == "Running" and status.attempts else None
    newest = plan.profiles[-1] if plan.profiles else None
    if newest is not None and answer is not None:
        _answered(newest, answer, now=now)
    if newest is not None and newest.state not in FINAL_STATES and _ended(status, newest.attempt):
        newest.state, newest.finish_time = "Failed", now
        newest.message = f"attempt {newest.attempt} ended before its profile was reported"
    if annotation is not None and (newest is None or newest.request != annotation[:32]):
        _record(plan, status, annotation, running=running, checkpoint_dir=checkpoint_dir, now=now)
    current = plan.profiles[-1] if plan.profiles else None
    asking = current is not None and current.state in ("Requested", "Capturing")
    if asking and current is not None and running is not None and current.attempt == running:
        plan.ask = ProfileAsk(current.id, current.steps or 0, running)
    del plan.profiles[:-MAX_PROFILE_ENTRIES]
    return plan


def _ended(status: MixedPrecisionJobStatus, attempt: int | None) -> bool:
    """Whether `attempt` is over: a later one began, or its entry has its ending."""
    latest = status.attempts[-1] if status.attempts else None
    return latest is None or latest.index != attempt or latest.reason is not None


def _record(
    plan: ProfilePlan,
    status: MixedPrecisionJobStatus,
    value: str,
    *,
    running: int | None,
    checkpoint_dir: str,
    now: str,
) -> None:
    """A new entry for the annotation's `value` (or nothing yet, while no attempt runs)."""
    profile_id = (plan.profiles[-1].id + 1) if plan.profiles else 1
    entry = ProfileStatus(id=profile_id, request=value[:32], state="Refused", request_time=now)
    try:
        entry.steps = profile_steps(value)
    except BadProfileRequest as bad:
        entry.message, entry.finish_time = str(bad), now
        plan.profiles.append(entry)
        plan.events.append(Event("Warning", ProfileReason.REFUSED, str(bad)))
        return
    if running is None and status.phase not in FINISHED:
        return  # asked once an attempt runs
    if running is None:
        entry.message, entry.finish_time = f"the job has {status.phase.lower()}: no attempt to profile", now
        plan.profiles.append(entry)
        plan.events.append(Event("Warning", ProfileReason.REFUSED, entry.message))
        return
    entry.state, entry.attempt = "Requested", running
    entry.path = posixpath.join(profile_dir(checkpoint_dir, profile_id), TRACE_FILE)
    plan.profiles.append(entry)
    said = f"profile {profile_id}: the next {entry.steps} steps of attempt {running}, into {entry.path}"
    plan.events.append(Event("Normal", ProfileReason.REQUESTED, said))


def _answered(entry: ProfileStatus, answer: ProfileAnswer, *, now: str) -> None:
    """What the trainer said of `entry` (an answer about another id changes nothing)."""
    if answer.id != entry.id or entry.state in FINAL_STATES:
        return
    entry.state = answer.state
    for name in ("steps", "first_step", "trace_bytes", "low_precision_kernel_share", "message"):
        value = getattr(answer, name)
        if value is not None:
            setattr(entry, name, value)
    if entry.state in FINAL_STATES:
        entry.finish_time = now
