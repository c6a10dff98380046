"""A change the trainer made in place was taken under the faultPolicy its attempt was launched with:
the running processes hold that spec. A policy edited since reaches the attempts launched after it;
the change is recorded as made (the fallback, its condition and Event), and an edit that fails the
fault still ends the job. Recorded under the edited rule instead, a fallback made in place read as
a retry: the attempt's message named a rule that decided nothing, the job trained in bf16 while no
PrecisionFallback condition or Event said it had fallen back."""

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
