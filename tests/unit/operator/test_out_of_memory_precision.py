"""Running out of device memory at a micro-batch holds later attempts below it by precision
(mpjob.planning.batch.too_big): in the precision it ran out in and in every one at least as wide
(more bytes per activation: fp32 after bf16), never in a narrower one (bf16 after fp32), which
keeps training.batchSize and the split rules. A status written before the precision was kept
(attemptCounts.outOfMemoryMicroBatch alone) holds every precision, as it did."""

from __future__ import annotations

from typing import Any

import pytest

from mpjob.planning import history
from mpjob.planning.batch import largest_micro_batch, largest_shape
from mpjob.planning.classify import AttemptOutcome, classify
from mpjob.planning.lifecycle import Plan, When
from mpjob.planning.planner import BatchShape, StartAttempt, after_attempt
from mpjob_contract.api import AttemptCounts, AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from tests.unit.operator import carried_out

pytestmark = pytest.mark.unit
WHEN = When("2026-12-01T12:00:00Z", 1)
FAULT, OOM, REPROMOTE = AttemptOutcome(42), AttemptOutcome(46), AttemptOutcome(47)


def spec(**precision: Any) -> MixedPrecisionJobSpec:
    return MixedPrecisionJobSpec.model_validate({
        "task": {"builtin": "mlp"},
        "training": {"batchSize": 16, "gradAccumulation": 1},
        "precision": {"mode": "bf16", "fallback": ["fp32"], "repromoteAfterSteps": 5, "maxRepromotions": 3,
                      **precision},
        "resources": {"gpusPerWorker": 0},
        "runPolicy": {"maxAttempts": 10},
    })  # fmt: skip


def ran_out(precision: str, micro_batch: int, index: int = 0) -> AttemptStatus:
    return AttemptStatus(index=index, precision=precision, reason="OutOfDeviceMemory", micro_batch=micro_batch,  # type: ignore[arg-type]
                         grad_accumulation=16 // micro_batch)  # fmt: skip


def walk(job: MixedPrecisionJobSpec, *outcomes: AttemptOutcome) -> tuple[Plan, list[tuple[str, BatchShape | None]]]:
    """Attempts through the lifecycle, each ending as the next of `outcomes`: (precision, shape) each."""
    plan, started = carried_out.through(job, WHEN, *outcomes)
    return plan, [(s.precision, s.shape) for s in started]


def test_fp32_running_out_at_8_leaves_a_repromoted_bf16_its_full_micro_batch() -> None:
    """bf16 16 faulted, fp32 8 x 2 ran out of memory (4 x 4), re-promoted: bf16 takes 16 again
    (fp32's activations take twice the bytes: its limit says nothing of bf16's)."""
    plan, shapes = walk(spec(), FAULT, OOM, REPROMOTE)
    assert shapes == [("bf16", BatchShape(16, 1)), ("fp32", BatchShape(8, 2)), ("fp32", BatchShape(4, 4)),
                      ("bf16", BatchShape(16, 1))]  # fmt: skip
    assert history.counts(plan.status).out_of_memory_micro_batches == {"fp32": 8}
    assert history.counts(plan.status).out_of_memory_micro_batch is None  # the old, every-precision field


def test_a_fallback_into_fp32_stays_below_the_micro_batch_fp32_ran_out_in() -> None:
    """... and when that bf16 faults again, fp32 takes 4 x 4 (it ran out at 8), not the 8 x 2 split."""
    _, shapes = walk(spec(), FAULT, OOM, REPROMOTE, FAULT)
    assert shapes[-1] == ("fp32", BatchShape(4, 4))


def test_a_repromoted_bf16_stays_below_a_micro_batch_bf16_itself_ran_out_in() -> None:
    """bf16 ran out at 16 (8 x 2), faulted (fp32 4 x 4), re-promoted: bf16 8 x 2, below its own."""
    _, shapes = walk(spec(), OOM, FAULT, REPROMOTE)
    assert shapes[1:] == [("bf16", BatchShape(8, 2)), ("fp32", BatchShape(4, 4)), ("bf16", BatchShape(8, 2))]


def test_bf16_running_out_at_8_holds_fp32_at_4() -> None:
    job = spec(fallbackKeepsBatch=False)
    assert largest_shape(job, "fp32", 1, [ran_out("bf16", 8)], None) == BatchShape(4, 4)
    assert largest_shape(job, "bf16", 1, [ran_out("bf16", 8)], None) == BatchShape(4, 4)


@pytest.mark.parametrize(
    ("was", "precision", "largest"),
    [
        ("fp32", "fp32", 7),
        ("fp32", "bf16", 16),  # narrower: its own limit
        ("fp32", "fp16", 16),
        ("fp32", "fp8", 16),
        ("bf16", "fp32", 7),  # wider
        ("bf16", "fp16", 7),  # as wide: fp8, fp16 and bf16 keep activations in 2 bytes
        ("fp16", "fp8", 7),
        ("auto", "bf16", 7),  # ran out before it measured: which precision is not known
    ],
)
def test_which_precisions_a_micro_batch_that_ran_out_holds(was: str, precision: str, largest: int) -> None:
    job = spec(fallbackKeepsBatch=False)
    assert largest_micro_batch(job, precision, [ran_out(was, 8)], None) == largest
    # the same from the counts, once the entry is gone from attempts[]
    assert largest_micro_batch(job, precision, [], AttemptCounts(out_of_memory_micro_batches={was: 8})) == largest


def test_the_smallest_of_each_precision_is_counted_when_an_attempt_ends() -> None:
    status = MixedPrecisionJobStatus()
    for entry in (ran_out("fp32", 8, 0), ran_out("fp32", 4, 1), ran_out("bf16", 16, 2), ran_out("fp32", 8, 3)):
        history.started(status, entry)
        history.ended(status, entry, charged=True)
    assert history.counts(status).out_of_memory_micro_batches == {"fp32": 4, "bf16": 16}


def test_a_status_written_before_the_precision_was_kept_holds_every_precision() -> None:
    """Its counts say only outOfMemoryMicroBatch (fp32 ran out at 8, its entry gone): a re-promoted
    bf16 stays below 8 as before, and an attempt that ends now keeps that and adds its own."""
    stored = {"attempts": [{"index": 0, "precision": "bf16", "reason": "NumericFault", "microBatch": 16},
                           {"index": 7, "precision": "fp32", "reason": "Repromote", "microBatch": 4}],
              "attemptCounts": {"started": 8, "charged": 8, "outOfMemoryMicroBatch": 8}}  # fmt: skip
    status = MixedPrecisionJobStatus.model_validate(stored)
    counts = history.counts(status)
    assert counts.out_of_memory_micro_batches == {}
    up = after_attempt(spec(), 7, "fp32", classify(REPROMOTE), 40, None, shape=BatchShape(4, 4),
                       history=status.attempts, counts=counts, used=8)  # fmt: skip
    assert isinstance(up, StartAttempt) and (up.precision, up.shape) == ("bf16", BatchShape(4, 4))
    entry = ran_out("bf16", 4, 8)
    history.started(status, entry)
    history.ended(status, entry, charged=True)
    assert (counts.out_of_memory_micro_batch, counts.out_of_memory_micro_batches) == (8, {"bf16": 4})
    assert status.to_api()["attemptCounts"]["outOfMemoryMicroBatches"] == {"bf16": 4}


def test_counts_made_from_the_entries_of_a_status_without_counts_keep_each_precision() -> None:
    status = MixedPrecisionJobStatus(attempts=[ran_out("fp32", 8, 0)])
    status.attempts[0].finish_time = WHEN.at
    assert history.counts(status).out_of_memory_micro_batches == {"fp32": 8}
