"""Profiles on demand, decided (planning/profiles.py): each annotation value asked once, bad
values refused naming the annotation, asks only of the running attempt, answers applied."""

from __future__ import annotations

import pytest

from mpjob.planning.profiles import plan_profiles
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobStatus
from mpjob_contract.tracking import MAX_PROFILE_ENTRIES, PROFILE_ANNOTATION, ProfileAnswer, ProfileStatus

pytestmark = pytest.mark.unit

FOLDER = "/var/lib/mpjob/checkpoints/ns/job/uid-1"
NOW = "2026-11-25T05:00:00Z"


def running(attempt: int = 1, **over: object) -> MixedPrecisionJobStatus:
    attempts = [AttemptStatus(index=i, precision="bf16") for i in range(attempt + 1)]
    return MixedPrecisionJobStatus(phase="Running", attempt=attempt, attempts=attempts, **over)


def test_a_good_value_is_recorded_with_its_path_and_asked_of_the_running_attempt() -> None:
    plan = plan_profiles(running(), "20", checkpoint_dir=FOLDER, now=NOW)
    (entry,) = plan.profiles
    assert (entry.id, entry.request, entry.steps, entry.attempt, entry.state) == (1, "20", 20, 1, "Requested")
    assert entry.path == f"{FOLDER}/profiles/p1/trace.json.gz"
    assert plan.ask is not None and (plan.ask.id, plan.ask.steps, plan.ask.attempt) == (1, 20, 1)
    assert [(e.type, e.reason) for e in plan.events] == [("Normal", "ProfileRequested")]


@pytest.mark.parametrize("value", ["0", "1000000", "-3", "twenty", "", "2.5", "²", "①"])  # digits to str.isdigit
def test_a_bad_value_is_refused_with_an_event_naming_the_annotation_and_nothing_asked(value: str) -> None:
    plan = plan_profiles(running(), value, checkpoint_dir=FOLDER, now=NOW)
    (entry,) = plan.profiles
    assert entry.state == "Refused" and plan.ask is None
    (event,) = plan.events
    assert event.type == "Warning" and event.reason == "ProfileRefused"
    assert f"metadata.annotations[{PROFILE_ANNOTATION}]" in event.message and "1 to 100" in event.message
    again = plan_profiles(running(profiles=plan.profiles), value, checkpoint_dir=FOLDER, now=NOW)
    assert again.profiles == plan.profiles and not again.events  # refused once, not on every tick


def test_a_value_already_profiled_is_not_asked_again_but_a_new_value_is() -> None:
    done = ProfileStatus(id=1, request="20", steps=20, attempt=1, state="Captured", path="p")
    same = plan_profiles(running(profiles=[done]), "20", checkpoint_dir=FOLDER, now=NOW)
    assert same.profiles == [done] and same.ask is None and not same.events
    new = plan_profiles(running(profiles=[done]), "5", checkpoint_dir=FOLDER, now=NOW)
    assert [p.id for p in new.profiles] == [1, 2] and new.ask is not None and new.ask.steps == 5


def test_while_no_attempt_runs_the_request_waits_and_a_finished_job_refuses_it() -> None:
    pending = MixedPrecisionJobStatus(phase="Recovering", attempts=[AttemptStatus(index=0, precision="fp16")])
    assert plan_profiles(pending, "20", checkpoint_dir=FOLDER, now=NOW).profiles == []
    done = MixedPrecisionJobStatus(phase="Succeeded", attempts=[AttemptStatus(index=0, precision="fp16")])
    (entry,) = plan_profiles(done, "20", checkpoint_dir=FOLDER, now=NOW).profiles
    assert entry.state == "Refused" and "succeeded" in (entry.message or "")


def test_the_trainers_answer_fills_the_entry_but_never_its_path() -> None:
    asked = ProfileStatus(id=1, request="4", steps=4, attempt=1, state="Requested", path="ours")
    answer = ProfileAnswer(
        id=1, state="Captured", steps=4, firstStep=11, path="/elsewhere", traceBytes=1234, lowPrecisionKernelShare=0.75
    )
    plan = plan_profiles(running(profiles=[asked]), "4", checkpoint_dir=FOLDER, now=NOW, answer=answer)
    (entry,) = plan.profiles
    assert (entry.state, entry.first_step, entry.trace_bytes, entry.low_precision_kernel_share) == (
        "Captured", 11, 1234, 0.75,
    )  # fmt: skip
    assert entry.path == "ours" and entry.finish_time == NOW and plan.ask is None
    other = ProfileAnswer(id=9, state="Captured")
    unchanged = plan_profiles(running(profiles=[asked]), "4", checkpoint_dir=FOLDER, now=NOW, answer=other)
    assert unchanged.profiles == [asked] and unchanged.ask is not None


def test_an_entry_whose_attempt_ended_fails_and_the_list_stays_bounded() -> None:
    asked = ProfileStatus(id=1, request="4", steps=4, attempt=0, state="Capturing")
    (entry,) = plan_profiles(running(attempt=1, profiles=[asked]), "4", checkpoint_dir=FOLDER, now=NOW).profiles
    assert entry.state == "Failed" and "attempt 0 ended" in (entry.message or "")
    capturing = ProfileStatus(id=1, request="4", steps=4, attempt=0, state="Capturing")
    recovering = MixedPrecisionJobStatus(phase="Recovering", attempts=[AttemptStatus(index=0, precision="fp16")])
    recovering.profiles = [capturing]
    (kept,) = plan_profiles(recovering, "4", checkpoint_dir=FOLDER, now=NOW).profiles  # not ended: kept, not asked
    assert kept.state == "Capturing"
    many = [ProfileStatus(id=i, request=str(i), state="Captured") for i in range(1, MAX_PROFILE_ENTRIES + 1)]
    plan = plan_profiles(running(profiles=many), "50", checkpoint_dir=FOLDER, now=NOW)
    assert len(plan.profiles) == MAX_PROFILE_ENTRIES and plan.profiles[-1].id == MAX_PROFILE_ENTRIES + 1


@pytest.mark.parametrize(("value", "ok"), [("20", True), ("0", False), ("1000000", False), ("²", False)])
def test_mpjob_validate_checks_the_annotation_naming_it(value: str, ok: bool) -> None:
    from mpjob.validation import check_text

    manifest = f"""
apiVersion: mpjob.dev/v1alpha1
kind: MixedPrecisionJob
metadata: {{name: j, annotations: {{"{PROFILE_ANNOTATION}": "{value}"}}}}
spec: {{task: {{builtin: gpt}}}}
"""
    jobs, problems = check_text(manifest)
    if ok:
        assert len(jobs) == 1 and not problems
    else:
        (problem,) = problems
        assert problem.field == f"metadata.annotations[{PROFILE_ANNOTATION}]" and "1 to 100" in problem.message
