"""A run resumed on another number of processes (a sharded checkpoint resharded) goes on with
the very next sample of the same global stream: StepSampler positions its data from the
checkpoint's samples_seen, not from the step alone (the sampler, and the builtin loop
resuming a 4-process FSDP2 checkpoint on 2 processes through the launcher, gloo on the CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mpjob_trainer.data import Origin, StepSampler
from tests.helpers import launched
from tests.unit.trainer.conftest import launch_env, parse, spec

pytestmark = pytest.mark.unit

SIZE, BATCH, ACCUMULATION, SEED = 40, 3, 2, 11  # 40 samples: the runs below cross epochs
START = Origin()  # a run from step 0


def served(world: int, steps: range, origin: Origin = START) -> list[int]:
    """The global sequence of sample indices the world's ranks serve over `steps`, in stream order
    (step, micro-batch, rank), as the ranks' samples together make up each micro-batch."""
    ranks = [StepSampler(SIZE, BATCH, ACCUMULATION, world, rank, SEED, origin=origin) for rank in range(world)]
    return [i for step in steps for micro in range(ACCUMULATION) for s in ranks for i in s.indices(step, micro)]


@pytest.mark.parametrize("at", [0, 5, 7])
def test_two_processes_resumed_from_four_serve_the_samples_four_would_have_served(at: int) -> None:
    per_step_4 = BATCH * ACCUMULATION * 4
    samples_seen = at * per_step_4  # what the 4-process run's checkpoint at step `at` holds
    four = served(4, range(at, at + 5))
    two = served(2, range(at, at + 10), Origin(at, samples_seen))  # half the samples per step: twice the steps
    assert two == four
    assert len(set(four)) < len(four)  # the window crosses an epoch: the order, not just the set, is compared


def test_four_processes_resumed_from_two_go_on_after_the_last_sample_seen() -> None:
    per_step_2 = BATCH * ACCUMULATION * 2
    before = served(2, range(0, 7))
    after = served(4, range(7, 12), Origin(7, 7 * per_step_2))
    assert before + after == served(1, range(0, 7 * 2 + 5 * 4))  # one stream, with no gap or repeat


def test_the_origin_of_an_unchanged_world_is_the_step_position() -> None:
    per_step = BATCH * ACCUMULATION * 2
    for rank in range(2):
        plain = StepSampler(SIZE, BATCH, ACCUMULATION, 2, rank, SEED)
        resumed = StepSampler(SIZE, BATCH, ACCUMULATION, 2, rank, SEED, origin=Origin(6, 6 * per_step))
        assert [resumed.step_indices(s) for s in range(6, 12)] == [plain.step_indices(s) for s in range(6, 12)]


def test_a_negative_origin_is_refused() -> None:
    with pytest.raises(ValueError, match="origin"):
        StepSampler(SIZE, BATCH, ACCUMULATION, 1, 0, SEED, origin=Origin(3, -1))


# ---------------------------------------------------------------- the builtin loop, resharded
REPO = Path(__file__).resolve().parents[3]
RECORDING = {
    "module": "tests.unit.trainer.recording_task:make_task",
    "args": {"inputs": 8, "hidden": 16, "samples": 96},
}


def launch(tmp: Path, job: dict[str, Any], *, nproc: int, record: Path) -> list[dict[str, Any]]:
    """The builtin loop on `nproc` processes of the launcher (gloo on the CPU)."""
    extra = {"PYTHONPATH": str(REPO), "MPJOB_TEST_RECORD": str(record)}
    env = launch_env(tmp, job, "fp32", ckpt=tmp / "ckpt", extra=extra, name=f"report-{nproc}.json")
    return parse(launched(env, nproc))


@pytest.mark.process
def test_the_builtin_loop_resumed_on_fewer_processes_trains_the_samples_four_would_have(tmp_path: Path) -> None:
    def job(steps: int) -> dict[str, Any]:
        training = {"steps": steps, "batchSize": 2, "logEvery": 5, "seed": 3}
        return spec(task=RECORDING, training=training, parallelism={"strategy": "fsdp"}, checkpoint={"everySteps": 5})

    launch(tmp_path, job(5), nproc=4, record=tmp_path / "four.txt")
    events = launch(tmp_path, job(15), nproc=2, record=tmp_path / "two.txt")
    assert [e["step"] for e in events if e["event"] == "resume"] == [5]  # the resharded checkpoint of four
    served = sorted(int(line) for line in (tmp_path / "two.txt").read_text().split())

    def four(rank: int) -> StepSampler:
        return StepSampler(96, 2, 1, 4, rank, 3)

    wanted = [i for step in range(5, 10) for rank in range(4) for i in four(rank).step_indices(step)]
    assert served == sorted(wanted)  # steps 5..14 on two processes: steps 5..9 of four, sample for sample
