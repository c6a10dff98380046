"""Settings that will not do what they say are named as warnings (mpjob_contract.spec_warnings):
each names its field, the values and what happens; the job stays valid, `mpjob validate` exits 0
and prints them, the operator posts each as a `SpecNeverApplies` Warning Event once per generation."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpjob.cli import main
from mpjob.planning.reconcile import reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.rule_warnings import never_applying
from mpjob_contract.spec_warnings import WarningReason, idle_settings, spec_warnings
from mpjob_trainer.loop import learning_rate
from tests.unit.operator.cases import GOOD

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def spec(steps: int = 300, **fields: Any) -> MixedPrecisionJobSpec:
    training = {"steps": steps, **fields.pop("training", {})}
    return MixedPrecisionJobSpec.model_validate({"task": {"builtin": "mlp"}, "training": training, **fields})


def said(job: MixedPrecisionJobSpec) -> dict[str, str]:
    return dict(idle_settings(job))


def test_checkpoints_no_sooner_than_the_end_lose_every_step_to_a_fault() -> None:
    assert said(spec(checkpoint={"everySteps": 500})) == {
        "checkpoint.everySteps": "checkpoint.everySteps=500 is more than training.steps=300: no checkpoint before the "
        "last step (but one a stop writes), so a fault starts the next attempt over from step 0"
    }
    assert "is equal to training.steps=300" in said(spec(checkpoint={"everySteps": 300}))["checkpoint.everySteps"]
    assert said(spec(checkpoint={"everySteps": 299})) == {}


def test_a_quality_gate_past_the_end_never_evaluates() -> None:
    assert said(spec(validation={"everySteps": 500})) == {
        "validation.everySteps": "validation.everySteps=500 is more than training.steps=300 (it never evaluates): "
        "the quality gate never ends a precision"
    }


def test_a_quality_gate_that_evaluates_once_never_sees_two_in_a_row() -> None:
    (why,) = said(spec(validation={"everySteps": 200})).values()
    assert why.startswith("validation.everySteps=200 evaluates 1 time in training.steps=300, and QualityDrift needs 2")
    assert said(spec(validation={"everySteps": 150})) == {}  # steps 150 and 300: two in a row can happen
    assert said(spec(validation={"everySteps": 0})) == {}  # off, as written


def test_a_quality_drift_rule_needs_a_gate_that_can_fire() -> None:
    drift = {"rules": [{"fault": "QualityDrift", "action": "Fail"}]}
    ((field, why),) = never_applying(spec(faultPolicy=drift, validation={"everySteps": 200}))
    assert field == "faultPolicy.rules[0]" and "QualityDrift comes only from the quality gate" in why
    assert "evaluates 1 time in training.steps=300" in why
    assert never_applying(spec(faultPolicy=drift, validation={"everySteps": 100})) == []


def test_a_stagnation_rule_needs_a_stagnation_check_that_can_fire() -> None:
    retry = {"rules": [{"fault": "NumericFault", "action": "Fail"}, {"fault": "Stagnation", "action": "Retry"}]}
    ((field, why),) = never_applying(spec(faultPolicy=retry))  # stagnationSteps 0 by default
    assert field == "faultPolicy.rules[1]" and why == (
        "never applies: Stagnation comes only from the stagnation check, and precision.guard.stagnationSteps is 0 (off)"
    )
    ((_, why),) = never_applying(spec(faultPolicy=retry, precision={"guard": {"stagnationSteps": 300}}))
    assert "stagnationSteps=300 is not below training.steps=300" in why
    assert never_applying(spec(faultPolicy=retry, precision={"guard": {"stagnationSteps": 50}})) == []


@pytest.mark.parametrize("fault", ["MaxConsecutiveOverflows", "LossScaleCollapsed"])
@pytest.mark.parametrize(
    ("precision", "ladder"),
    [
        ({"mode": "bf16"}, "precision.mode is bf16 and precision.fallback is [fp32]"),
        ({"mode": "fp32"}, "precision.mode is fp32 and precision.fallback is []"),
        ({"mode": "bf16", "fallback": []}, "precision.mode is bf16 and precision.fallback is []"),
        ({"mode": "fp8"}, "precision.mode is fp8 and precision.fallback is [bf16, fp32]"),  # float8: no GradScaler
    ],
)
def test_a_loss_scale_rule_needs_an_fp16_rung(fault: str, precision: dict[str, Any], ladder: str) -> None:
    """Only an fp16 attempt trains with a GradScaler, whose overflows and collapse these rules are on."""
    retry = {"rules": [{"fault": "NumericFault", "action": "Fail"}, {"fault": fault, "action": "Retry"}]}
    found = spec_warnings(spec(faultPolicy=retry, precision=precision))
    assert [(w.reason, w.message) for w in found] == [
        (
            WarningReason.FAULT_RULE_NEVER_APPLIES,
            f"spec.faultPolicy.rules[1]: never applies: {fault} comes only from fp16's GradScaler, and no attempt "
            f"trains fp16: {ladder}",
        )
    ]


@pytest.mark.parametrize(
    "precision",
    [
        {"mode": "fp16"},
        {"mode": "fp8", "fallback": ["fp16", "fp32"]},  # the fallback trains fp16
        {"mode": "auto", "fallback": ["bf16", "fp32"]},  # measured on the node: fp16 on compute capability 7.x
    ],
)
def test_a_loss_scale_rule_with_an_fp16_rung_or_auto_says_nothing(precision: dict[str, Any]) -> None:
    for fault in ("MaxConsecutiveOverflows", "LossScaleCollapsed"):
        rules = {"rules": [{"fault": fault, "action": "Fail"}]}
        assert never_applying(spec(faultPolicy=rules, precision=precision)) == []


def test_the_operator_posts_a_loss_scale_rule_on_a_bf16_job_once_per_generation() -> None:
    job = spec(precision={"mode": "bf16"}, faultPolicy={"rules": [{"fault": "LossScaleCollapsed", "action": "Fail"}]})
    first = reconcile(job, MixedPrecisionJobStatus(), 1, {}, NOW)
    posted = [(e.type, e.message) for e in first.events if e.reason == WarningReason.FAULT_RULE_NEVER_APPLIES]
    assert posted == [
        (
            "Warning",
            "spec.faultPolicy.rules[0]: never applies: LossScaleCollapsed comes only from fp16's GradScaler, and no "
            "attempt trains fp16: precision.mode is bf16 and precision.fallback is [fp32]",
        )
    ]
    assert first.create, "the job is still accepted: its first attempt starts"
    again = reconcile(job, first.status, 1, {}, NOW)
    assert [e for e in again.events if e.reason == WarningReason.FAULT_RULE_NEVER_APPLIES] == []


def test_a_second_rule_on_one_guard_rule_never_applies_but_numeric_fault_after_it_does() -> None:
    rules = [("MaxConsecutiveOverflows", "Fail"), ("NumericFault", "Retry"), ("MaxConsecutiveOverflows", "Retry")]
    policy = {"rules": [{"fault": fault, "action": action} for fault, action in rules]}
    assert never_applying(spec(faultPolicy=policy, precision={"mode": "fp16"})) == [
        ("faultPolicy.rules[2]", "never applies: rules[0] is on MaxConsecutiveOverflows too and comes first")
    ]


def test_a_fall_back_rule_with_an_empty_ladder_never_applies() -> None:
    fall = {"rules": [{"fault": "LossSpike", "action": "FallBack"}]}
    ((_, why),) = never_applying(spec(faultPolicy=fall, precision={"mode": "bf16", "fallback": []}))
    assert why.endswith("needs a precision below the starting one, and precision.fallback is empty")


@pytest.mark.parametrize(
    ("precision", "checkpoint", "because"),
    [
        ({"mode": "fp32"}, 100, "no attempt falls back, precision.mode fp32 has none"),
        ({"mode": "fp16", "fallback": []}, 100, "no attempt falls back, precision.fallback is empty"),
        ({"mode": "fp16", "maxRepromotions": 0}, 100, "precision.maxRepromotions is 0"),
        ({"mode": "fp16", "repromoteAfterSteps": 300}, 100, "is not below training.steps=300: no attempt has"),
        ({"mode": "fp16", "repromoteAfterSteps": 250}, 200, "the first with 250 steps behind it, step 400, is not"),
    ],
)
def test_a_repromotion_that_can_never_happen(precision: dict[str, Any], checkpoint: int, because: str) -> None:
    job = spec(precision={"repromoteAfterSteps": 100, **precision}, checkpoint={"everySteps": checkpoint})
    why = said(job)["precision.repromoteAfterSteps"]
    assert why.startswith(f"precision.repromoteAfterSteps={job.precision.repromote_after_steps} ") and because in why


def test_a_repromotion_that_can_happen_says_nothing() -> None:
    # A checkpoint at step 200 with 200 clean steps behind it (a fallback from step 0), before step 300.
    assert said(spec(precision={"mode": "fp16", "repromoteAfterSteps": 150}, checkpoint={"everySteps": 100})) == {}
    assert said(spec(precision={"mode": "fp16"})) == {}  # repromoteAfterSteps 0: off, as written


def test_a_stagnation_check_longer_than_the_run_never_ends_a_precision() -> None:
    (why,) = said(spec(precision={"guard": {"stagnationSteps": 300}})).values()
    assert why.startswith("precision.guard.stagnationSteps=300 is not below training.steps=300")
    assert said(spec(precision={"guard": {"stagnationSteps": 299}})) == {}


def test_a_warm_up_as_long_as_the_run_never_decays_and_a_longer_one_never_reaches_the_peak() -> None:
    (why,) = said(spec(training={"warmupSteps": 600})).values()
    assert why == (
        "training.warmupSteps=600 is not below training.steps=300: the learning rate rises the whole run, never "
        "reaches training.learningRate=0.0006 (at most 0.0003), and never decays (a warm-up below training.steps "
        "leaves steps to decay in)"
    )
    rates = [learning_rate(step, 300, 6e-4, 600) for step in range(300)]  # the builtin loop's, step by step
    assert rates == sorted(rates) and rates[-1] == pytest.approx(3e-4)
    (why,) = said(spec(training={"warmupSteps": 300})).values()
    assert "reaches training.learningRate=0.0006 only at the last step, and never decays" in why
    assert max(learning_rate(step, 300, 6e-4, 300) for step in range(300)) == pytest.approx(6e-4)
    assert said(spec(training={"warmupSteps": 299})) == {}


def test_a_warm_up_of_a_command_job_says_nothing() -> None:
    """Its own loop may read training.warmupSteps or not: not certainly dead."""
    job = {"task": {"command": ["python", "train.py"]}, "training": {"steps": 300, "warmupSteps": 600}}
    assert said(MixedPrecisionJobSpec.model_validate(job)) == {}


def test_a_loss_scale_growth_interval_past_the_run_never_grows_the_scale() -> None:
    (why,) = said(spec(precision={"lossScale": {"growthInterval": 300}})).values()
    assert why.startswith("precision.lossScale.growthInterval=300 is not below training.steps=300: no attempt has")
    assert "the fp16 loss scale never grows, it only backs off on overflows" in why
    assert said(spec(precision={"lossScale": {"growthInterval": 299}})) == {}


def test_the_default_growth_interval_says_nothing_written_out_or_not() -> None:
    """The API server writes the CRD's default (2000) into every stored spec, so the operator's
    spec holds it as set: a job of 300 steps that never named lossScale is not warned about it."""
    assert said(spec()) == {}
    assert said(spec(precision={"lossScale": {"growthInterval": 2000}})) == {}  # as the operator reads it


def test_a_loss_scale_floor_above_the_scale_at_the_first_read_ends_every_fp16_attempt_there() -> None:
    """The guard ends fp16 when the scale is below guard.minLossScale at a read, overflows or not
    (a run of such a job fell back at its first log step, step 5, and again after re-promoting)."""
    job = spec(precision={"mode": "fp16", "guard": {"minLossScale": 1e6}}, training={"logEvery": 5})
    assert said(job) == {
        "precision.guard.minLossScale": "precision.guard.minLossScale=1e+06 is above precision.lossScale.init=65536, "
        "and the scale is at most 65536 at the guard's first read (step 5): every fp16 attempt ends "
        "LossScaleCollapsed there, with no overflow (a floor at or below lossScale.init ends it only once "
        "overflows have backed the scale off below it)"
    }
    fp8_then_fp16 = {"mode": "fp8", "fallback": ["fp16", "fp32"], "guard": {"minLossScale": 1e6}}
    assert "precision.guard.minLossScale" in said(spec(precision=fp8_then_fp16))


@pytest.mark.parametrize(
    "precision",
    [
        {"mode": "fp16", "guard": {"minLossScale": 65536}},  # at lossScale.init: only overflows go below
        {"mode": "bf16", "guard": {"minLossScale": 1e6}},  # no fp16 on the ladder: no loss scale
        {"mode": "fp16", "guard": {"minLossScale": 4}, "lossScale": {"init": 1, "growthInterval": 3}},  # 8 at step 10
    ],
)
def test_a_loss_scale_floor_the_scale_can_stand_above_says_nothing(precision: dict[str, Any]) -> None:
    assert said(spec(precision=precision)) == {}


def test_a_loss_spike_rule_needs_a_spike_window_the_run_fills() -> None:
    spike = {"rules": [{"fault": "LossSpike", "action": "FallBack"}]}
    ((field, why),) = never_applying(spec(steps=60, faultPolicy=spike))
    assert (field, why) == (
        "faultPolicy.rules[0]",
        "never applies: LossSpike comes only from the spike check, and precision.guard.spike.window=128 is not "
        "below training.steps=60: the window of losses a spike is judged against is never full, so no loss is "
        "ever judged",
    )
    assert "precision.guard.spike.window" not in said(spec(steps=60, faultPolicy=spike)), "said once, as the rule's"
    assert never_applying(spec(steps=60, faultPolicy=spike, precision={"guard": {"spike": {"window": 8}}})) == []


def test_a_spike_rollback_whose_window_the_run_never_fills_never_rolls_back() -> None:
    rollback = {"guard": {"spike": {"action": "rollback"}}}
    why = said(spec(steps=100, precision=rollback))["precision.guard.spike.window"]
    assert why.startswith("precision.guard.spike.window=128 is not below training.steps=100: ")
    assert why.endswith(": guard.spike.action rollback never rolls back")
    assert "precision.guard.spike.window" not in said(spec(steps=129, precision=rollback))


def test_each_warning_has_its_reason_and_message() -> None:
    rules = {"rules": [{"fault": "NumericFault", "action": "Fail"}, {"fault": "NumericFault", "action": "Retry"}]}
    found = spec_warnings(spec(faultPolicy=rules, checkpoint={"everySteps": 500}))
    assert [(w.reason, w.message.split(":")[0]) for w in found] == [
        (WarningReason.FAULT_RULE_NEVER_APPLIES, "spec.faultPolicy.rules[1]"),
        (WarningReason.SPEC_NEVER_APPLIES, "spec.checkpoint.everySteps"),
    ]
    assert found[1].line("job.yaml") == f"job.yaml: warning: {found[1].message}"


def test_validate_prints_a_setting_warning_and_still_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**GOOD, "spec": {**GOOD["spec"], "training": {"steps": 100}}}))
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{path}: warning: spec.checkpoint.everySteps: checkpoint.everySteps=200 is more than training.steps=100: "
        "no checkpoint before the last step (but one a stop writes), so a fault starts the next attempt over "
        "from step 0",
        f"{path}: ok (1 MixedPrecisionJob)",
    ]


def test_the_operator_posts_a_setting_warning_once_per_generation() -> None:
    job = spec(validation={"everySteps": 500})
    first = reconcile(job, MixedPrecisionJobStatus(), 1, {}, NOW)
    posted = [(e.type, e.message.split(":")[0]) for e in first.events if e.reason == WarningReason.SPEC_NEVER_APPLIES]
    assert posted == [("Warning", "spec.validation.everySteps")]
    assert first.create, "the job is still accepted: its first attempt starts"
    again = reconcile(job, first.status, 1, {}, NOW)
    assert [e for e in again.events if e.reason == WarningReason.SPEC_NEVER_APPLIES] == []


def test_a_template_label_the_operator_sets_is_named_as_replaced() -> None:
    mine = {"app.kubernetes.io/name": "trainer", "mpjob.dev/precision": "fp32", "team": "vision"}
    (why,) = said(spec(template={"labels": mine})).values()
    assert why.startswith("template.labels app.kubernetes.io/name, mpjob.dev/precision: the operator labels")
    assert "team" not in why
    assert said(spec(template={"labels": {"team": "vision", "mpjob.dev/owner": "ml"}})) == {}
