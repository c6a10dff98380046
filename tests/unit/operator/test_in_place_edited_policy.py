"""A change the trainer made in place was taken under the faultPolicy its attempt was launched with:
the running processes hold that spec. A policy edited since reaches the attempts launched after it;
the change is recorded as made (the fallback, its condition and Event), and an edit that fails the
fault still ends the job. Recorded under the edited rule instead, a fallback made in place read as
a retry: the attempt's message named a rule that decided nothing, the job trained in bf16 while no
PrecisionFallback condition or Event said it had fallen back. Likewise a re-promotion in place after
precision.maxRepromotions was lowered: recorded as no re-promotion, it went uncounted, and the
PrecisionFallback condition still said fp16 -> bf16 while the job trained in fp16."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mpjob.planning.reconcile import JobView, PodView, reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.report import InPlaceChange

pytestmark = pytest.mark.unit
NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
MESSAGE = "MaxNonFiniteLosses: 5 non-finite losses in this attempt; fp32 replayed steps 43-46 finitely"


def spec(*rules: dict[str, str]) -> MixedPrecisionJobSpec:
    doc = {
        "task": {"builtin": "gpt"},
        "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
        "resources": {"gpusPerWorker": 1},
        "faultPolicy": {"rules": list(rules)},
    }
    return MixedPrecisionJobSpec.model_validate(doc)


def running() -> JobView:
    started = (NOW - timedelta(seconds=100)).isoformat()
    return JobView(0, pods=(PodView("p0", 0, "Running", alive=True, started_at=started),))


def launched(s: MixedPrecisionJobSpec) -> MixedPrecisionJobStatus:
    first = reconcile(s, MixedPrecisionJobStatus(), 1, {}, NOW - timedelta(seconds=100)).status
    return reconcile(s, first, 1, {0: running()}, NOW - timedelta(seconds=90)).status


def fell_back() -> InPlaceChange:
    return InPlaceChange.model_validate(
        {"attempt": 1, "step": 50, "startStep": 40, "fromPrecision": "fp16", "toPrecision": "bf16",
         "rule": "MaxNonFiniteLosses", "message": MESSAGE, "recoverySeconds": 0.25}
    )  # fmt: skip


def test_a_fallback_made_in_place_before_an_edit_to_retry_is_recorded_as_the_fallback_it_was() -> None:
    status = launched(spec())  # launched under the built-in policy: its trainer falls back in place
    edited = spec({"fault": "NumericFault", "action": "Retry"})
    plan = reconcile(edited, status, 2, {0: running()}, NOW, changes=[fell_back()])
    first, second = plan.status.attempts
    assert (first.reason, first.message) == (Reason.NUMERIC_FAULT.value, MESSAGE)  # no rule decided it
    assert (second.precision, second.in_place, plan.status.precision) == ("bf16", True, "bf16")
    assert plan.fallbacks == [("fp16", "bf16")]
    (fallback,) = [c for c in plan.status.conditions if c.type == "PrecisionFallback"]
    assert fallback.status == "True"
    assert any(e.reason == "PrecisionFallback" for e in plan.events)


def test_an_edit_that_fails_the_fault_still_ends_the_job_at_a_change_in_place() -> None:
    status = launched(spec())
    edited = spec({"fault": "MaxNonFiniteLosses", "action": "Fail"})
    plan = reconcile(edited, status, 2, {0: running()}, NOW, changes=[fell_back()])
    assert plan.status.phase == "Failed" and plan.delete == [0]
    assert plan.status.attempts[0].message.startswith("spec.faultPolicy.rules[0] (fault: MaxNonFiniteLosses")


def test_a_repromotion_made_in_place_after_repromotion_was_turned_off_is_recorded_as_one() -> None:
    precision = {"mode": "fp16", "fallback": ["bf16", "fp32"], "repromoteAfterSteps": 10}
    s = spec().model_copy(update={"precision": spec().precision.model_validate(precision)})
    fell = reconcile(s, launched(s), 1, {0: running()}, NOW - timedelta(seconds=20), changes=[fell_back()]).status
    up = InPlaceChange.model_validate(
        {"kind": "repromote", "attempt": 2, "step": 60, "startStep": 60, "fromPrecision": "bf16",
         "toPrecision": "fp16", "rule": "repromote", "message": "20 clean steps in bf16; checkpoint at step 60 written",
         "recoverySeconds": 0.01}
    )  # fmt: skip
    # the user stops the climbs while the bf16 attempt runs; its trainer, launched to climb, climbs
    edited = s.model_copy(update={"precision": s.precision.model_copy(update={"max_repromotions": 0})})
    plan = reconcile(edited, fell, 2, {0: running()}, NOW, changes=[up])
    promoted = plan.status.attempts[-1]
    assert (promoted.precision, promoted.in_place, promoted.repromoted) == ("fp16", True, True)
    assert plan.status.attempt_counts is not None and plan.status.attempt_counts.repromotions == 1
    (fallback,) = [c for c in plan.status.conditions if c.type == "PrecisionFallback"]
    assert (fallback.status, fallback.reason) == ("False", "Repromoted")  # back in fp16, where it began
    assert plan.repromotions == [("bf16", "fp16")]
