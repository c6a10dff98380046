"""An attempt with a split micro-batch (fp32 after fp16/bf16, or after running out of GPU
memory) trains on the same samples per optimizer step, in the same order, and resumes from
the previous attempt's checkpoint as an unsplit run would."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from mpjob_trainer.data import StepSampler
from tests.unit.trainer.conftest import run_trainer, spec

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
RECORDING = {
    "module": "tests.unit.trainer.recording_task:make_task",
    "args": {"inputs": 8, "hidden": 16, "samples": 96},
}


@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize(
    ("whole_shape", "split_shape"),
    [((8, 1), (4, 2)), ((16, 1), (8, 2)), ((8, 2), (4, 4)), ((12, 2), (6, 4))],  # and back (a re-promotion)
)
def test_a_split_micro_batch_covers_the_same_samples_per_step(
    world: int, whole_shape: tuple[int, int], split_shape: tuple[int, int]
) -> None:
    def per_step(shape: tuple[int, int], step: int) -> list[list[int]]:
        return [StepSampler(96, *shape, world, rank, seed=5).step_indices(step) for rank in range(world)]

    for step in (0, 3, 11):  # 11: into the second epoch (or the third)
        whole, split = per_step(whole_shape, step), per_step(split_shape, step)
        assert sorted(i for r in whole for i in r) == sorted(i for r in split for i in r)
        if world == 1:
            assert whole == split  # the same order, too


def _served(path: Path, per_step: int) -> list[list[int]]:
    indices = [int(line) for line in path.read_text().split()]
    assert len(indices) % per_step == 0
    return [indices[i : i + per_step] for i in range(0, len(indices), per_step)]


@pytest.mark.process
def test_an_fp32_fallback_with_a_split_micro_batch_resumes_in_the_data_order_of_an_unsplit_run(
    tmp_path: Path,
) -> None:
    job = spec(task=RECORDING, training={"steps": 30, "batchSize": 8}, checkpoint={"everySteps": 10})
    first = spec(task=RECORDING, training={"steps": 20, "batchSize": 8}, checkpoint={"everySteps": 10})
    record = {"PYTHONPATH": str(REPO), "MPJOB_TEST_RECORD": str(tmp_path / "fp16.txt")}
    fp16 = run_trainer(tmp_path / "a0", first, "fp16", ckpt=tmp_path / "ckpt", extra=record)
    assert fp16.code == 0, fp16.stderr
    runs = {}
    for name, shape in (("split", (4, 2)), ("whole", None)):
        ckpt = tmp_path / f"ckpt-{name}"
        shutil.copytree(tmp_path / "ckpt", ckpt)
        env = {"PYTHONPATH": str(REPO), "MPJOB_TEST_RECORD": str(tmp_path / f"{name}.txt")}
        resume = str(ckpt / "step-000000020")
        runs[name] = run_trainer(
            tmp_path / name, job, "fp32", attempt=1, ckpt=ckpt, resume_from=resume, extra=env, shape=shape
        )
        assert runs[name].code == 0, runs[name].stderr
        assert runs[name].of("resume")[0]["step"] == 20
    split, whole = _served(tmp_path / "split.txt", 8), _served(tmp_path / "whole.txt", 8)
    assert len(split) == len(whole) == 10  # steps 20-29, 8 samples each: the effective batch is kept
    assert split == whole  # and the same samples in the same order
    a = torch.load(tmp_path / "ckpt-split" / "step-000000030" / "state.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "ckpt-whole" / "step-000000030" / "state.pt", weights_only=True)["model"]
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)
