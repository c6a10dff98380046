"""A re-promoted attempt's batch shape: the largest micro-batch its precision allows given the
job's history (mpjob.planning.batch), the rule a grown elastic attempt follows too. fp32's split
of precision.fallbackKeepsBatch is undone going back up to fp16; a split for running out of
device memory stays; the samples of each optimizer step stay the same."""

from __future__ import annotations

from typing import Any

import pytest

from mpjob.planning.batch import largest_micro_batch
from mpjob.planning.classify import AttemptOutcome, classify
from mpjob.planning.elastic import Capacity, decide
from mpjob.planning.lifecycle import Plan, When
from mpjob.planning.planner import BatchShape, StartAttempt, after_attempt
from mpjob_contract.api import AttemptCounts, AttemptStatus, MixedPrecisionJobSpec
from tests.unit.operator import carried_out

pytestmark = pytest.mark.unit
WHEN = When("2026-12-01T12:00:00Z", 1)
FAULT, OOM, REPROMOTE = AttemptOutcome(42), AttemptOutcome(46), AttemptOutcome(47)


def spec(**over: Any) -> MixedPrecisionJobSpec:
    doc: dict[str, Any] = {
        "task": {"builtin": "mlp"},
        "training": {"batchSize": 16, "gradAccumulation": 1},
        "precision": {"mode": "fp16", "fallback": ["fp32"], "repromoteAfterSteps": 5, "maxRepromotions": 3},
        "resources": {"gpusPerWorker": 0},
        "runPolicy": {"maxAttempts": 10},
    }
    doc.update(over)
    return MixedPrecisionJobSpec.model_validate(doc)


def _run(job: MixedPrecisionJobSpec, *outcomes: AttemptOutcome) -> tuple[Plan, list[StartAttempt]]:
    return carried_out.through(job, WHEN, *outcomes)


def _walk(started: list[StartAttempt]) -> list[tuple[str, BatchShape | None]]:
    return [(s.precision, s.shape) for s in started]


def test_a_repromotion_after_the_fp32_split_of_fallbackkeepsbatch_takes_the_full_micro_batch_back() -> None:
    plan, started = _run(spec(), FAULT, REPROMOTE)
    assert _walk(started) == [("fp16", BatchShape(16, 1)), ("fp32", BatchShape(8, 2)), ("fp16", BatchShape(16, 1))]
    assert started[-1].promoted_from == "fp32"
    ran = [(a.precision, a.micro_batch, a.grad_accumulation) for a in plan.status.attempts]
    assert ran == [("fp16", 16, 1), ("fp32", 8, 2), ("fp16", 16, 1)]  # as the status shows them


def test_a_fallback_after_a_repromotion_splits_again_for_fp32() -> None:
    _, started = _run(spec(), FAULT, REPROMOTE, FAULT)
    assert started[-1].precision == "fp32" and started[-1].shape == BatchShape(8, 2)


def test_a_repromotion_keeps_a_split_made_for_running_out_of_device_memory() -> None:
    """fp16 ran out of memory at 16 (8 x 2), faulted (fp32, split again: 4 x 4), re-promoted:
    fp16 takes 8 x 2, the largest micro-batch below the one it ran out of memory in."""
    _, started = _run(spec(), OOM, FAULT, REPROMOTE)
    assert _walk(started) == [
        ("fp16", BatchShape(16, 1)),
        ("fp16", BatchShape(8, 2)),
        ("fp32", BatchShape(4, 4)),
        ("fp16", BatchShape(8, 2)),
    ]


def test_a_repromotion_is_not_held_by_a_split_for_running_out_of_memory_in_fp32() -> None:
    """fp32 keeps activations in twice fp16's bytes: what it ran out in leaves fp16 its own limit."""
    _, started = _run(spec(), FAULT, OOM, REPROMOTE)
    assert _walk(started)[1:] == [("fp32", BatchShape(8, 2)), ("fp32", BatchShape(4, 4)), ("fp16", BatchShape(16, 1))]


def test_a_repromotion_keeps_an_out_of_memory_split_whose_entry_is_gone_from_attempts() -> None:
    job = spec()
    history = [
        AttemptStatus(index=0, precision="fp16", reason="NumericFault", micro_batch=16, grad_accumulation=1),
        AttemptStatus(index=7, precision="fp32", reason="Repromote", micro_batch=4, grad_accumulation=4),
    ]
    counts = AttemptCounts(started=8, charged=8, out_of_memory_micro_batch=16)
    up = after_attempt(job, 7, "fp32", classify(REPROMOTE), 40, None, shape=BatchShape(4, 4), history=history,
                       counts=counts, used=8)  # fmt: skip
    assert isinstance(up, StartAttempt) and (up.precision, up.shape) == ("fp16", BatchShape(8, 2))


def test_without_fallbackkeepsbatch_every_attempt_keeps_the_full_micro_batch() -> None:
    job = spec(precision={"mode": "fp16", "fallback": ["fp32"], "repromoteAfterSteps": 5, "fallbackKeepsBatch": False})
    _, started = _run(job, FAULT, REPROMOTE)
    assert {s.shape for s in started} == {BatchShape(16, 1)}


def test_a_repromotion_keeps_the_gradient_accumulation_of_the_spec() -> None:
    job = spec(training={"batchSize": 12, "gradAccumulation": 2})
    _, started = _run(job, FAULT, REPROMOTE)
    assert _walk(started) == [("fp16", BatchShape(12, 2)), ("fp32", BatchShape(6, 4)), ("fp16", BatchShape(12, 2))]


def test_an_exit_47_never_told_to_repromote_keeps_its_shape() -> None:
    job = spec(precision={"mode": "fp16", "fallback": ["fp32"], "repromoteAfterSteps": 0})
    _, started = _run(job, FAULT, REPROMOTE)
    assert _walk(started)[1:] == [("fp32", BatchShape(8, 2)), ("fp32", BatchShape(8, 2))]


def test_a_repromotion_of_a_smaller_elastic_attempt_keeps_its_world_and_the_global_batch() -> None:
    """4 workers of 4 samples, 2 left after a node was lost (4 x 2 each), fp32 (2 x 4), re-promoted:
    fp16 on those 2 workers takes 4 x 2 again (16 samples a step over the job, as the spec says)."""
    job = spec(workers=4, training={"batchSize": 4}, elastic={"minWorkers": 1, "waitSeconds": 60})
    lost = decide(job, workers=4, shape=BatchShape(4, 1), capacity=Capacity(2, node_lost=True))
    _, started = _run(job, AttemptOutcome(137, resize=lost), FAULT, REPROMOTE)
    assert [(s.precision, s.workers, s.shape) for s in started[1:]] == [
        ("fp16", 2, BatchShape(4, 2)),
        ("fp32", 2, BatchShape(2, 4)),
        ("fp16", 2, BatchShape(4, 2)),
    ]


def test_one_rule_sizes_a_repromotion_and_a_grown_attempt() -> None:
    job = spec()
    ran = [AttemptStatus(index=0, precision="fp16", reason="NumericFault", micro_batch=16, grad_accumulation=1)]
    assert largest_micro_batch(job, "fp16", ran, None) == 16
    assert largest_micro_batch(job, "fp32", ran, None) == 8
    assert largest_micro_batch(job, "fp16", ran, AttemptCounts(out_of_memory_micro_batch=16)) == 15
    assert largest_micro_batch(job, "fp16", ran, AttemptCounts(out_of_memory_micro_batches={"fp16": 16})) == 15
