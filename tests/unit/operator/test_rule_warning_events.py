"""A fault rule that can never apply (mpjob_contract.spec_warnings) is a Warning Event from the
operator, `FaultRuleNeverApplies`, once per spec generation: the job is still accepted and runs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from mpjob.planning.reconcile import reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.spec_warnings import WarningReason
from tests.unit.operator.test_api_errors import FakeCluster, events, reconciler  # noqa: F401 (a fixture)

pytestmark = pytest.mark.unit
REASON = WarningReason.FAULT_RULE_NEVER_APPLIES
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
SHADOWED = {"rules": [{"fault": "NumericFault", "action": "Fail"}, {"on": "NumericFault", "action": "FallBack"}]}
MESSAGE = "spec.faultPolicy.rules[1]: never applies: rules[0] is on NumericFault too and comes first"


def spec(**fields: Any) -> MixedPrecisionJobSpec:
    return MixedPrecisionJobSpec.model_validate({"task": {"builtin": "gpt"}, **fields}, by_alias=True)


def warned(posted: list[Any]) -> list[str]:
    return [e.message for e in posted if e.reason == REASON]


def test_a_shadowed_rule_is_a_warning_event_once_per_generation() -> None:
    job = spec(faultPolicy=SHADOWED)
    first = reconcile(job, MixedPrecisionJobStatus(), 1, {}, NOW)
    assert [(e.type, e.message) for e in first.events if e.reason == REASON] == [("Warning", MESSAGE)]
    assert first.create, "the job is still accepted: its first attempt starts"
    again = reconcile(job, first.status, 1, {}, NOW)
    assert warned(again.events) == []  # the same generation: said already
    edited = reconcile(job, again.status, 2, {}, NOW)
    assert warned(edited.events) == [MESSAGE]  # an edit that keeps the rule: said for the new generation


def test_each_rule_that_never_applies_is_named_with_why() -> None:
    rules = {"rules": [{"fault": "QualityDrift", "action": "Fail"}, {"fault": "LossSpike", "action": "FallBack"}]}
    plan = reconcile(spec(faultPolicy=rules, precision={"mode": "fp32"}), MixedPrecisionJobStatus(), 1, {}, NOW)
    said = warned(plan.events)
    assert [m.split(":")[0] for m in said] == ["spec.faultPolicy.rules[0]", "spec.faultPolicy.rules[1]"]
    assert "spec.validation.everySteps is 0" in said[0] and "precision.mode fp32 has none" in said[1]


def test_rules_that_all_apply_say_nothing() -> None:
    rules = {"rules": [{"fault": "NumericFault", "action": "Fail"}, {"fault": "LossSpike", "action": "RollBack"}]}
    assert warned(reconcile(spec(faultPolicy=rules), MixedPrecisionJobStatus(), 1, {}, NOW).events) == []


def test_the_operator_posts_it_once_over_reconciles_and_again_after_an_edit(events: list) -> None:  # noqa: F811
    cluster = FakeCluster()
    cluster.body["spec"]["faultPolicy"] = SHADOWED
    made = reconciler(cluster)
    for tick in (False, True, True):
        made.handle(("ns", "j"), tick)
    assert [m for reason, m in events if reason == REASON] == [MESSAGE]
    assert cluster.body["status"]["phase"] != "Failed"  # accepted, never refused
    cluster.body["metadata"]["generation"] = 2  # a spec edit (here: another field) keeps the rule
    made.bodies.offer(("ns", "j"), cluster.edited())
    made.handle(("ns", "j"), False)
    made.handle(("ns", "j"), True)
    assert [m for reason, m in events if reason == REASON] == [MESSAGE, MESSAGE]
