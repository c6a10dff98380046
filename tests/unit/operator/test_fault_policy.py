"""The fault policy as data (mpjob_contract.faults): the table of allowed actions, pair by pair;
decisions, the most specific rule first, then the first in order; and the operator's reading of
a job's rules (planning.classify)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
import yaml

from mpjob.planning.classify import Action, AttemptOutcome, classify, under_policy
from mpjob.validation import check_text
from mpjob_contract.codes import Reason
from mpjob_contract.faults import ACTIONS, Decision, Fault, FaultAction, allowed, decide, fault_of
from mpjob_contract.policy import FaultPolicy
from mpjob_contract.report import TerminationReport
from tests.unit.operator.cases import bad
from tests.unit.operator.test_rules import crd_schema

pytestmark = pytest.mark.unit

F, A = Fault, FaultAction
#: The guard rules NumericFault covers, each a fault a rule may name too.
COVERED = (F.MAX_NON_FINITE_LOSSES, F.MAX_CONSECUTIVE_OVERFLOWS, F.LOSS_SCALE_COLLAPSED, F.STAGNATION)
#: The table written out once more, by hand: every pair not here is refused.
EXPECTED_ALLOWED = {
    *((fault, action) for fault in (F.NUMERIC_FAULT, *COVERED) for action in (A.FALL_BACK, A.RETRY, A.FAIL)),
    (F.QUALITY_DRIFT, A.FALL_BACK), (F.QUALITY_DRIFT, A.FAIL),
    (F.LOSS_SPIKE, A.ROLL_BACK), (F.LOSS_SPIKE, A.FALL_BACK), (F.LOSS_SPIKE, A.FAIL),
    (F.NON_FINITE_IN_FP32, A.SKIP), (F.NON_FINITE_IN_FP32, A.FAIL),
    (F.OUT_OF_DEVICE_MEMORY, A.SMALLER_MICRO_BATCH),
    (F.OUT_OF_DEVICE_MEMORY, A.RETRY), (F.OUT_OF_DEVICE_MEMORY, A.FAIL),
    (F.PREEMPTED, A.RETRY), (F.PREEMPTED, A.FAIL),
    (F.INFRA_ERROR, A.RETRY), (F.INFRA_ERROR, A.FAIL),
    (F.STALLED, A.RETRY), (F.STALLED, A.FAIL),
    (F.OOM_KILLED, A.FAIL), (F.OOM_KILLED, A.RETRY),
}  # fmt: skip
#: The built-in action of each fault: what today's operator and trainer do without rules.
BUILT_IN = {
    **dict.fromkeys((F.NUMERIC_FAULT, *COVERED), A.FALL_BACK),
    F.QUALITY_DRIFT: A.FALL_BACK,
    F.LOSS_SPIKE: A.ROLL_BACK,
    F.NON_FINITE_IN_FP32: A.SKIP,
    F.OUT_OF_DEVICE_MEMORY: A.SMALLER_MICRO_BATCH,
    F.PREEMPTED: A.RETRY,
    F.INFRA_ERROR: A.RETRY,
    F.STALLED: A.RETRY,
    F.OOM_KILLED: A.FAIL,
}


@pytest.mark.parametrize(("fault", "action"), list(itertools.product(Fault, FaultAction)))
def test_every_fault_and_action_pair_is_allowed_exactly_as_the_table_says(fault: Fault, action: FaultAction) -> None:
    assert allowed(fault, action) is ((fault, action) in EXPECTED_ALLOWED)
    refused = not allowed(fault, action)
    try:
        FaultPolicy.model_validate({"rules": [{"fault": fault.value, "action": action.value}]})
    except ValueError as exc:
        assert refused and "faultPolicy.rules[].action must be one that its fault allows" in str(exc)
    else:
        assert not refused


def test_without_rules_each_fault_gets_its_built_in_action() -> None:
    assert {fault: decide([], fault).action for fault in Fault} == BUILT_IN
    assert {fault: ACTIONS[fault][0] for fault in Fault} == BUILT_IN
    assert all(decide([], fault).rule is None for fault in Fault)


def test_the_first_rule_on_a_fault_decides_and_names_itself() -> None:
    rules = [(F.PREEMPTED, A.FAIL), (F.NUMERIC_FAULT, A.RETRY), (F.NUMERIC_FAULT, A.FAIL)]
    decision = decide(rules, F.NUMERIC_FAULT)
    assert (decision.action, decision.rule) == (A.RETRY, 1)
    assert decision.names() == "spec.faultPolicy.rules[1] (fault: NumericFault, action: Retry)"
    assert decide(rules, F.QUALITY_DRIFT).rule is None  # a drift has a name of its own


@pytest.mark.parametrize("general_first", [True, False])
def test_a_rule_on_the_guard_rule_beats_one_on_numeric_fault_in_either_order(general_first: bool) -> None:
    general, specific = (F.NUMERIC_FAULT, A.FAIL), (F.MAX_CONSECUTIVE_OVERFLOWS, A.RETRY)
    rules = [general, specific] if general_first else [specific, general]
    at = rules.index(specific)
    assert decide(rules, F.MAX_CONSECUTIVE_OVERFLOWS) == Decision(A.RETRY, F.MAX_CONSECUTIVE_OVERFLOWS, at)
    assert decide(rules, F.MAX_CONSECUTIVE_OVERFLOWS).names() == (
        f"spec.faultPolicy.rules[{at}] (fault: MaxConsecutiveOverflows, action: Retry)"
    )
    # NumericFault still covers the guard rules no rule names, and a report that names none.
    for fault in (F.MAX_NON_FINITE_LOSSES, F.LOSS_SCALE_COLLAPSED, F.STAGNATION, F.NUMERIC_FAULT):
        assert decide(rules, fault) == Decision(A.FAIL, F.NUMERIC_FAULT, 1 - at)
    assert decide(rules, F.QUALITY_DRIFT).rule is None  # NumericFault never covered a drift


def test_the_first_of_two_rules_on_one_guard_rule_decides_and_the_built_in_comes_last() -> None:
    rules = [(F.STAGNATION, A.RETRY), (F.PREEMPTED, A.FAIL), (F.STAGNATION, A.FAIL)]
    assert decide(rules, F.STAGNATION) == Decision(A.RETRY, F.STAGNATION, 0)
    assert decide(rules, F.MAX_NON_FINITE_LOSSES) == Decision(A.FALL_BACK, F.MAX_NON_FINITE_LOSSES)
    assert decide(rules, F.NUMERIC_FAULT) == Decision(
        A.FALL_BACK, F.NUMERIC_FAULT
    )  # a rule on Stagnation is not on all
    assert decide(rules, F.STAGNATION).names() == "spec.faultPolicy.rules[0] (fault: Stagnation, action: Retry)"


@pytest.mark.parametrize(
    ("reason", "rule", "fault"),
    [
        (Reason.NUMERIC_FAULT, "MaxConsecutiveOverflows", F.MAX_CONSECUTIVE_OVERFLOWS),
        (Reason.NUMERIC_FAULT, "MaxNonFiniteLosses", F.MAX_NON_FINITE_LOSSES),
        (Reason.NUMERIC_FAULT, "LossScaleCollapsed", F.LOSS_SCALE_COLLAPSED),
        (Reason.NUMERIC_FAULT, "Stagnation", F.STAGNATION),
        (Reason.NUMERIC_FAULT, "SomethingNew", F.NUMERIC_FAULT),
        (Reason.NUMERIC_FAULT, None, F.NUMERIC_FAULT),
        (Reason.NUMERIC_FAULT, "QualityDrift", F.QUALITY_DRIFT),
        (Reason.NUMERIC_FAULT, "LossSpike", F.LOSS_SPIKE),
        (Reason.NON_FINITE_IN_FP32, None, F.NON_FINITE_IN_FP32),
        (Reason.OUT_OF_DEVICE_MEMORY, None, F.OUT_OF_DEVICE_MEMORY),
        (Reason.PREEMPTED, None, F.PREEMPTED),
        (Reason.EVICTED, None, F.PREEMPTED),
        (Reason.DELETED, None, F.INFRA_ERROR),
        (Reason.INFRA_ERROR, None, F.INFRA_ERROR),
        (Reason.STALLED, None, F.STALLED),
        (Reason.OOM_KILLED, None, F.OOM_KILLED),
        (Reason.SUCCEEDED, None, None),
        (Reason.CONFIG_ERROR, None, None),
        (Reason.REPROMOTE, None, None),
    ],
)
def test_an_ending_is_the_fault_the_status_names(reason: Reason, rule: str | None, fault: Fault | None) -> None:
    assert fault_of(reason, rule) == fault


def ended(reason: Reason, code: int, rule: str | None = None) -> AttemptOutcome:
    report = TerminationReport(reason=reason, step=7, precision="fp16", rule=rule, message="what the trainer said")
    return AttemptOutcome(exit_code=code, report=report)


def test_a_jobs_rule_turns_a_fallback_into_a_failure_that_names_it() -> None:
    outcome = ended(Reason.NUMERIC_FAULT, 42, "MaxConsecutiveOverflows")
    fails = FaultPolicy.model_validate({"rules": [{"fault": "NumericFault", "action": "Fail"}]})
    assert classify(outcome).action is Action.NEXT_PRECISION
    result = under_policy(classify(outcome), fails, outcome.report)
    assert result.action is Action.FAIL and result.reason is Reason.NUMERIC_FAULT
    assert result.message == "spec.faultPolicy.rules[0] (fault: NumericFault, action: Fail): what the trainer said"


def test_overflows_fail_by_their_own_rule_while_nan_losses_fall_back_by_numeric_faults() -> None:
    policy = FaultPolicy.model_validate(
        {
            "rules": [
                {"fault": "NumericFault", "action": "FallBack"},
                {"fault": "MaxConsecutiveOverflows", "action": "Fail"},
            ]
        }
    )
    overflow = ended(Reason.NUMERIC_FAULT, 42, "MaxConsecutiveOverflows")
    nan = ended(Reason.NUMERIC_FAULT, 42, "MaxNonFiniteLosses")
    failed = under_policy(classify(overflow), policy, overflow.report)
    assert failed.action is Action.FAIL and failed.reason is Reason.NUMERIC_FAULT  # the status keeps its reason
    assert (
        failed.message
        == "spec.faultPolicy.rules[1] (fault: MaxConsecutiveOverflows, action: Fail): what the trainer said"
    )
    assert under_policy(classify(nan), policy, nan.report) == classify(nan)  # the built-in fallback, unnamed
    stagnation = ended(Reason.NUMERIC_FAULT, 42, "Stagnation")
    retries = FaultPolicy.model_validate({"rules": [{"fault": "Stagnation", "action": "Retry"}]})
    assert under_policy(classify(stagnation), retries, stagnation.report).action is Action.SAME_PRECISION


def test_a_rule_that_fails_bad_data_names_itself_though_the_operator_fails_it_anyway() -> None:
    # The built-in action is the trainer's Skip: the attempt ends NonFiniteInFp32 (which the
    # operator fails) only because the rule said Fail, and the job's message says which rule.
    bad_data = ended(Reason.NON_FINITE_IN_FP32, 45)
    fails = FaultPolicy.model_validate({"rules": [{"fault": "NonFiniteInFp32", "action": "Fail"}]})
    result = under_policy(classify(bad_data), fails, bad_data.report)
    assert result.action is Action.FAIL
    assert result.message == "spec.faultPolicy.rules[0] (fault: NonFiniteInFp32, action: Fail): what the trainer said"


def test_a_rule_on_quality_drift_leaves_other_numeric_faults_alone() -> None:
    drift_fails = FaultPolicy.model_validate({"rules": [{"fault": "QualityDrift", "action": "Fail"}]})
    overflow = ended(Reason.NUMERIC_FAULT, 42, "MaxConsecutiveOverflows")
    drift = ended(Reason.NUMERIC_FAULT, 42, "QualityDrift")
    assert under_policy(classify(overflow), drift_fails, overflow.report) == classify(overflow)
    assert under_policy(classify(drift), drift_fails, drift.report).action is Action.FAIL


def test_rules_the_operator_does_not_carry_out_or_that_agree_change_nothing() -> None:
    bad_data = ended(Reason.NON_FINITE_IN_FP32, 45)
    skips = FaultPolicy.model_validate({"rules": [{"fault": "NonFiniteInFp32", "action": "Skip"}]})
    assert under_policy(classify(bad_data), skips, bad_data.report) == classify(bad_data)  # the trainer's to do
    preempted = ended(Reason.PREEMPTED, 44)
    retries = FaultPolicy.model_validate({"rules": [{"fault": "Preempted", "action": "Retry"}]})
    assert under_policy(classify(preempted), retries, preempted.report) == classify(preempted)
    oom = ended(Reason.OUT_OF_DEVICE_MEMORY, 46)
    same = FaultPolicy.model_validate({"rules": [{"fault": "OutOfDeviceMemory", "action": "Retry"}]})
    assert under_policy(classify(oom), same, oom.report).action is Action.SAME_PRECISION


def test_a_host_oom_fails_the_job_unless_a_rule_retries_it_charged_and_named() -> None:
    """A container the kernel killed for host memory failed the job whatever the job said: no
    fault named it. Failing stays the built-in action; `{fault: OOMKilled, action: Retry}` takes
    the same precision again (a memory spike that comes and goes), charged, the rule named."""
    killed = AttemptOutcome(137, platform_reason="OOMKilled", message="the kernel killed the trainer")
    assert (classify(killed).reason, classify(killed).action) == (Reason.OOM_KILLED, Action.FAIL)
    retries = FaultPolicy.model_validate({"rules": [{"fault": "OOMKilled", "action": "Retry"}]})
    result = under_policy(classify(killed), retries, None)
    assert result.action is Action.SAME_PRECISION and result.charged
    named = "spec.faultPolicy.rules[0] (fault: OOMKilled, action: Retry)"
    assert result.message == f"{named}: the kernel killed the trainer"
    fails = FaultPolicy.model_validate({"rules": [{"fault": "OOMKilled", "action": "Fail"}]})
    assert under_policy(classify(killed), fails, None) == classify(killed)  # the built-in, unnamed


def test_a_rule_under_the_former_name_on_decides_as_one_under_fault() -> None:
    """Jobs stored with `"on"` (quoted: unquoted, YAML makes it true) keep their rules."""
    former = FaultPolicy.model_validate({"rules": [{"on": "NumericFault", "action": "Fail"}]})
    current = FaultPolicy.model_validate({"rules": [{"fault": "NumericFault", "action": "Fail"}]})
    assert former.decide(F.NUMERIC_FAULT) == current.decide(F.NUMERIC_FAULT) == Decision(A.FAIL, F.NUMERIC_FAULT, 0)
    assert former.decide(F.QUALITY_DRIFT).rule is None


def test_a_name_neither_fault_nor_guard_rule_is_refused_naming_the_field_and_every_allowed_name() -> None:
    policy = {"rules": [{"fault": "Stagnation", "action": "Retry"}, {"fault": "MaxOverflows", "action": "Fail"}]}
    _, problems = check_text(yaml.safe_dump(bad("spec.faultPolicy", policy)), "job.yaml")
    (problem,) = problems
    assert problem.field == "spec.faultPolicy.rules[1].fault" and "got 'MaxOverflows'" in str(problem)
    assert all(f"'{fault.value}'" in str(problem) for fault in Fault), str(problem)
    spec = crd_schema()["properties"]["spec"]["properties"]["faultPolicy"]["properties"]["rules"]["items"]
    assert spec["properties"]["fault"]["enum"] == [fault.value for fault in Fault]  # the API server's list
    jobs, problems = check_text(yaml.safe_dump(bad("spec.faultPolicy", {"rules": policy["rules"][:1]})), "job.yaml")
    assert problems == [] and len(jobs) == 1  # a guard rule's name is a fault's


def fault_policy_page() -> str:
    return (Path(__file__).resolve().parents[3] / "docs/fault-policy.md").read_text()


def test_the_pages_table_shows_each_faults_actions_built_in_first() -> None:
    rows = [line.split("|")[1:5] for line in fault_policy_page().splitlines() if line.startswith("| `")]
    shown = {}
    for fault, _, built_in, others in rows:
        actions = [a for a in re.findall(r"`(\w+)`", built_in + others) if a in set(FaultAction)]
        shown[fault.strip(" `")] = actions
    faults = {f.value: [a.value for a in ACTIONS[f]] for f in Fault}
    assert {f: shown.get(f) for f in faults} == faults


def test_the_page_names_every_ending_no_rule_applies_to() -> None:
    page = " ".join(fault_policy_page().split())
    listed = page.split("about endings the policy does not rule on (", 1)[1].split(")", 1)[0]
    assert {r.value for r in Reason if fault_of(r) is None} == set(re.findall(r"[A-Z]\w+", listed))
