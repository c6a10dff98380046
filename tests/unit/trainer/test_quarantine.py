"""The data rung's pure parts: the quarantine (what checkpoints hold of it, how a sampler
leaves it out), the spike detector (device-only per step) and the batchScale fault."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from torch.utils.data import TensorDataset

from mpjob_contract.skipping import SpikeSpec
from mpjob_trainer.data import StepBatches, StepLoader, StepSampler
from mpjob_trainer.distributed import World
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.quarantine import Quarantine
from mpjob_trainer.session.outcomes import LossSpiked
from mpjob_trainer.spike import SpikeDetector
from mpjob_trainer.tasks.faults import batch_scale

pytestmark = pytest.mark.unit


def test_a_quarantine_round_trips_through_a_checkpoint_and_merges_on_rollback() -> None:
    q = Quarantine()
    q.add(4, "data", [30])
    saved = q.state_dict()
    q.add(9, "spike", [1, 2])
    q.load_state_dict(saved)  # a rollback to an older checkpoint keeps what was learnt since
    assert q.steps == [4, 9] and q.samples == {30, 1, 2}
    fresh = Quarantine()
    fresh.load_state_dict(torch.load(_saved(q.state_dict()), weights_only=True))  # weights_only-safe
    assert fresh.steps == [4, 9] and 30 in fresh and fresh.keep([1, 5, 30]) == [5]
    whole = Quarantine()
    whole.add(3, "data")  # the loop named no samples: the step itself is skipped
    assert whole.skips_step(3) and not whole.skips_step(4) and whole.samples == frozenset()


def _saved(state: dict) -> object:
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_the_summary_counts_exactly_and_lists_a_bounded_few() -> None:
    q = Quarantine()
    for step in range(20):
        q.add(step, "data", range(step * 10, step * 10 + 10))
    summary = q.summary(steps=8, spans=4)
    assert (summary.count, summary.samples, len(summary.steps)) == (20, 200, 8)
    assert summary.steps[0].samples[0].model_dump() == {"first": 0, "last": 9}


def test_a_step_skipped_whole_counts_its_samples_through_a_checkpoint() -> None:
    q = Quarantine()
    q.add(4, "data", whole=8)  # a framework's batch: the loop named no samples, the step held 8
    q.add(9, "spike", [1, 2], whole=8)  # named samples are counted as named
    assert q.summary().samples == 10 and q.skips_step(4) and not q.skips_step(9)
    fresh = Quarantine()
    fresh.load_state_dict(torch.load(_saved(q.state_dict()), weights_only=True))
    assert (fresh.summary().count, fresh.summary().samples) == (2, 10) and fresh.skips_step(4)
    older = Quarantine()
    older.load_state_dict({"records": [[4, "data", []], [9, "spike", [1, 2]]]})  # a checkpoint before the count
    assert (older.summary().count, older.summary().samples) == (2, 2) and older.skips_step(4)


def test_a_sampler_leaves_quarantined_samples_out_and_keeps_the_rest_in_order() -> None:
    plain = StepSampler(64, 8, 2, 1, 0, 5)
    q = Quarantine()
    sampler = StepSampler(64, 8, 2, 1, 0, 5, quarantine=q)
    before = plain.indices(3, 1)
    q.add(3, "data", [before[2]])
    assert sampler.indices(3, 1) == before[:2] + before[3:]
    q.add(3, "data", plain.indices(3, 0))  # a whole micro-batch quarantined: dropped from its step
    assert sampler.micro_count(3) == 1 and sampler.micro_count(4) == 2
    assert [len(b) for b in StepBatches(sampler, 3, 4)] == [7]


def test_every_rank_runs_as_many_passes_as_the_rank_holding_the_most_micro_batches() -> None:
    q = Quarantine()
    ranks = [StepSampler(64, 2, 2, 2, rank, 5, quarantine=q) for rank in range(2)]
    assert [s.passes(3) for s in ranks] == [2, 2]
    q.add(3, "data", ranks[1].step_indices(3))  # rank 1's every sample of step 3; rank 0's stay
    assert [s.micro_count(3) for s in ranks] == [2, 0] and [s.passes(3) for s in ranks] == [2, 2]
    assert ranks[0].filler(3) == ranks[0].indices(3, 0) and ranks[1].filler(3) == ranks[0].indices(3, 0)
    data = TensorDataset(torch.arange(64.0))
    loader = StepLoader(data, ranks[1], span=range(3, 4), workers=0, pin=False)
    batches, sizes = loader.passes(3)  # padded with rank 0's first micro-batch, weighed 0
    assert sizes == [0, 0] and [b[0].tolist() for b in batches] == [[float(i) for i in ranks[0].indices(3, 0)]] * 2
    q.add(3, "data", ranks[0].step_indices(3))  # every rank's: every rank skips the step alike
    assert [s.passes(3) for s in ranks] == [0, 0] and loader.passes(3) == ([], [])
    alone = StepSampler(64, 2, 2, 1, 0, 5, quarantine=q)  # one process: its own micro-batches, no padding
    assert ranks[0].passes(4) == 2 and all(alone.passes(step) == alone.micro_count(step) for step in range(40))


def test_too_few_quarantined_samples_to_empty_a_micro_batch_read_no_ranks_samples() -> None:
    """A micro-batch empties only when each of its samples is quarantined: with fewer quarantined
    than a micro-batch holds, every rank runs every pass, and the ranks' samples are not read."""
    q = Quarantine()
    q.add(0, "data", [1, 2, 3])
    sampler = StepSampler(1024, 4, 8, 64, 0, 5, quarantine=q)
    read: list[int | None] = []
    original = sampler.indices
    sampler.indices = lambda step, micro, rank=None: read.append(rank) or original(step, micro, rank)  # type: ignore[method-assign]
    assert [sampler.passes(step) for step in range(20)] == [8] * 20 and read == []
    q.add(1, "data", [4])  # four: a micro-batch of four could empty now
    assert sampler.passes(1) == 8 and len(read) == 64 * 8


@contextmanager
def no_host_reads() -> Iterator[None]:
    """Fail on any read of a device value on the host (a sync on a GPU)."""
    names = ("item", "tolist", "__bool__", "__float__", "__int__")
    originals = {name: getattr(torch.Tensor, name) for name in names}

    def refuse(*_: object, **__: object) -> object:
        raise AssertionError("the spike detector read a device value on the host")

    for name in names:
        setattr(torch.Tensor, name, refuse)
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def test_the_spike_detector_flags_a_finite_spike_without_a_host_read_per_step() -> None:
    detector = SpikeDetector(SpikeSpec(action="rollback", z_score=6, window=8), torch.device("cpu"))
    noise = torch.Generator().manual_seed(1)
    losses = [1.0 + 0.01 * float(torch.randn((), generator=noise)) for _ in range(30)]
    losses[20:23] = [50.0, 60.0, 40.0]
    losses[10] = float("nan")  # non-finite: the guard's, not a spike (and not in the window)
    with no_host_reads():
        for index, loss in enumerate(losses):
            detector.observe(torch.tensor(loss), index)
            if (index + 1) % 5 == 0:  # the guard's reads, every logEvery steps
                values = detector.values()
    assert detector.agreed([float(v) for v in values]) == range(20, 23)
    assert int(detector.accepted) == 30 - 1 - 3  # not the NaN, not the spikes
    detector.forget_spikes()
    assert detector.agreed([float(v) for v in detector.values()]) is None


def test_only_the_steps_that_spiked_are_the_spikes_not_those_between_two() -> None:
    """Spikes at steps 11 and 14 of one interval: the span the ranks agree on is 11-14, and the
    spiking steps in it are 11 and 14 (12 and 13 trained on an ordinary loss, kept)."""
    detector = SpikeDetector(SpikeSpec(action="rollback", z_score=6, window=8), torch.device("cpu"))
    noise = torch.Generator().manual_seed(2)
    losses = [1.0 + 0.01 * float(torch.randn((), generator=noise)) for _ in range(15)]
    losses[11], losses[14] = 50.0, 40.0
    with no_host_reads():
        for index, loss in enumerate(losses):
            detector.observe(torch.tensor(loss), index)
            if (index + 1) % 5 == 0:
                values = detector.values()
    span = detector.agreed([float(v) for v in values])
    assert span == range(11, 15)
    assert detector.spiked(span, World(rank=0, size=1, local_rank=0)) == (11, 14)
    assert "loss spike at step(s) 12, 15 (detected at 15)" in str(LossSpiked((11, 14), 15))  # counted from 1
    detector.forget_spikes()
    assert detector.spiked(span, World(rank=0, size=1, local_rank=0)) == ()


def test_the_spike_detector_waits_for_a_full_window_and_ignores_a_flat_loss() -> None:
    detector = SpikeDetector(SpikeSpec(action="rollback", window=8), torch.device("cpu"))
    for index, loss in enumerate([1.0] * 5 + [100.0] + [2.0] * 20):  # 100 comes before the window is full
        detector.observe(torch.tensor(loss), index)
        if (index + 1) % 3 == 0:
            assert detector.agreed([float(v) for v in detector.values()]) is None
    state = detector.state_dict()
    again = SpikeDetector(SpikeSpec(action="rollback", window=8), torch.device("cpu"))
    again.load_state_dict(state)
    assert torch.equal(again.window, detector.window) and int(again.accepted) == int(detector.accepted)


def test_batch_scale_scales_the_targets_of_its_steps_only() -> None:
    scale = batch_scale({"atStep": 5, "steps": 2})
    target = torch.ones(3)
    scale.set_step(4)
    assert torch.equal(scale(target), target)
    scale.set_step(6)
    assert torch.equal(scale(target), target * 1000)
    with pytest.raises(ConfigError, match=r"task\.args\.batchScale"):
        batch_scale({"atStep": "x"})


def test_a_loader_collating_ahead_starts_over_when_the_quarantine_changes() -> None:
    dataset = TensorDataset(torch.arange(64).float().unsqueeze(1), torch.zeros(64, 1))
    q = Quarantine()
    sampler = StepSampler(64, 4, 1, 1, 0, 3, quarantine=q)
    loader = StepLoader(dataset, sampler, span=range(0, 10), workers=1, pin=False)
    try:
        loader.micro_batches(0)
        loader.micro_batches(1)  # the worker has collated steps ahead by now
        bad = sampler.indices(5, 0)[1]
        q.add(5, "data", [bad])
        for step in range(2, 6):
            (inputs, _), *rest = loader.micro_batches(step)
            assert rest == [] and bad not in inputs.squeeze(1).long().tolist()
        (inputs, _), *_ = loader.micro_batches(6)
        assert inputs.shape[0] == 4  # the others keep their samples
    finally:
        loader.close()
