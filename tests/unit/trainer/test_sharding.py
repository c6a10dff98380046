"""FSDP2 sharding (spec.parallelism.strategy: fsdp) on real gloo process groups on the CPU.

Each case runs as 1, 2 or 4 processes of tests/unit/trainer/sharding_ranks.py that meet in one
process group; every rank reports what it saw."""

from __future__ import annotations

import io
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from mpjob_contract.api import Guard
from mpjob_contract.parallelism import Fsdp, Parallelism
from mpjob_trainer import sharding
from mpjob_trainer.events import EventLog
from tests import warm

pytestmark = pytest.mark.unit

RANKS = Path(__file__).with_name("sharding_ranks.py")


def ranks(tmp_path: Path, case: str, world: int, timeout: float = 240) -> list[dict[str, Any]]:
    """Run `case` on `world` processes; each rank's result."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(key, None)
    procs = [
        warm.Popen(
            [sys.executable, str(RANKS), case, str(r), str(world), str(tmp_path)],
            env=env,
            stdout=warm.PIPE,
            stderr=warm.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outputs, strict=True)):
        assert p.returncode == 0, f"rank {r} of {case} exited {p.returncode}:\n{out[-3000:]}"
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize(
    ("precision", "param", "reduce"),
    [("fp16", torch.float16, torch.float32), ("bf16", torch.bfloat16, torch.float32), ("fp32", None, None)],
)
def test_the_policy_follows_the_attempts_precision(precision: str, param: torch.dtype, reduce: torch.dtype) -> None:
    mp = sharding.policy(precision, Parallelism(strategy="fsdp"))  # type: ignore[arg-type]
    assert (mp.param_dtype, mp.reduce_dtype) == (param, reduce)


def test_fp32_gathering_and_low_reduction_are_the_users_choice() -> None:
    settings = Parallelism.model_validate({"fsdp": {"mixedPrecisionParam": "fp32", "mixedPrecisionReduce": "attempt"}})
    mp = sharding.policy("bf16", settings)
    assert (mp.param_dtype, mp.reduce_dtype) == (torch.float32, torch.bfloat16)
    assert not sharding.fixes_low_compute("bf16", settings.model_copy(update={"strategy": "fsdp"}))
    assert sharding.fixes_low_compute("fp16", Parallelism(strategy="fsdp"))
    assert not sharding.fixes_low_compute("fp16", Parallelism())


def test_an_fp8_attempt_gathers_in_bf16_so_its_fp32_replay_is_skipped_as_bf16s_is() -> None:
    """fp8 runs all but its float8 linears under bf16 autocast, and FSDP2 gathers its weights in
    bf16: a "fp32" replay would compute in bf16 and could blame the data for fp8's fault."""
    fsdp = Parallelism(strategy="fsdp")
    assert sharding.policy("fp8", fsdp).param_dtype == torch.bfloat16
    assert sharding.fixes_low_compute("fp8", fsdp)
    lines = io.StringIO()
    assert sharding.replayable(Guard(), "fp8", fsdp, EventLog(stream=lines)).replay_steps == 0
    assert json.loads(lines.getvalue())["event"] == "replaySkipped"
    assert not sharding.fixes_low_compute("fp8", fsdp.model_copy(update={"fsdp": Fsdp(mixed_precision_param="fp32")}))
    assert not sharding.fixes_low_compute("fp32", fsdp) and not sharding.fixes_low_compute(None, fsdp)


@pytest.mark.parametrize(("precision", "low"), [("bf16", "torch.bfloat16"), ("fp16", "torch.float16")])
@pytest.mark.process
def test_blocks_compute_in_the_low_precision_keep_fp32_modules_in_fp32_masters_stay_fp32_shards(
    tmp_path: Path, precision: str, low: str
) -> None:
    for seen in ranks(tmp_path, f"dtypes:{precision}", 2):
        assert seen["gathered"] == {
            "blocks.0.attn.qkv": low,
            "lm_head": low,
            "blocks.0.ln_1": "torch.float32",  # keepFp32: its own fully_shard with an fp32 policy
            "ln_f": "torch.float32",
        }
        for name, (dtype, kind, placements) in seen["sharded"].items():
            assert (dtype, kind, placements) == ("torch.float32", "DTensor", "(Shard(dim=0),)"), name
        assert seen["gradDtypes"] == ["torch.float32"]


@pytest.mark.process
def test_fp32_attempts_cast_nothing(tmp_path: Path) -> None:
    seen = ranks(tmp_path, "dtypes:fp32", 2)[0]
    assert set(seen["gathered"].values()) == {"torch.float32"}


@pytest.mark.process
def test_every_rank_skips_the_same_fp16_overflow_step(tmp_path: Path) -> None:
    """Only rank 1's gradients hold inf: GradScaler's found_inf is agreed over the mesh, so both
    ranks skip step 2, back the scale off alike and leave their shards untouched."""
    results = ranks(tmp_path, "overflow", 2)
    for seen in results:
        assert seen["applied"] == [1, 0, 1]
        assert seen["overflowSteps"] == 1 and seen["unchanged"]
    assert results[0]["scales"] == results[1]["scales"] == [65536.0, 32768.0, 32768.0]


@pytest.mark.process
def test_ranks_that_see_different_losses_agree_whether_the_state_may_be_checkpointed(tmp_path: Path) -> None:
    """A checkpoint is a collective: a rank that skips it while another takes it waits in another
    collective for ever. Every read's verdict is the same on both ranks, and says unhealthy for a
    NaN seen by one rank only (even when the largest count did not grow) or reported by one rank."""
    seen = ranks(tmp_path, "guard_agrees", 2)
    assert [r["healthy"] for r in seen] == [[False, False, False, True]] * 2
    assert [r["nonFinite"] for r in seen] == [1, 1]


@pytest.mark.process
def test_the_ranks_agree_on_the_steps_that_spiked_on_any_of_them_and_on_no_others(tmp_path: Path) -> None:
    seen = ranks(tmp_path, "spikes_agree", 2)
    assert [r["spikes"] for r in seen] == [[None, None, [11, 14]]] * 2


@pytest.mark.process
def test_the_clip_norm_is_the_unsharded_models(tmp_path: Path) -> None:
    for seen in ranks(tmp_path, "clip", 2):
        assert not seen["isDTensor"]  # a plain device tensor: the guard reads it like DDP's
        assert seen["norm"] == pytest.approx(seen["reference"], rel=1e-5)
        assert seen["norm"] > 0.05  # clipping did something
        assert seen["worst"] < 1e-6  # and the clipped gradients are the unsharded model's


@pytest.mark.process
def test_the_builtin_gpt_shards_per_transformer_block(tmp_path: Path) -> None:
    for seen in ranks(tmp_path, "blocks", 2):
        assert seen["fsdpBlocks"] == [True, True, True] and seen["root"] and seen["allDTensor"]
        assert seen["checkpointed"] == [True, False, True]  # selective: every 2nd block
        assert seen["gradsFinite"]


@pytest.mark.parametrize(("precision", "world"), [("bf16", 4), ("fp16", 2), ("fp32", 1)])
@pytest.mark.process
def test_a_short_fsdp_run_trains(tmp_path: Path, precision: str, world: int) -> None:
    """Four processes in bf16, two in fp16 (scaled), and a world of one (legal under fsdp)."""
    results = ranks(tmp_path, f"train:{precision}", world)
    for seen in results:
        assert seen["last"] < seen["first"] - 0.2, seen
        assert seen["applied"] >= 20  # fp16: the first steps calibrate the scale
    assert len({round(s["last"], 3) for s in results}) == world or world == 1  # each rank its own data


@pytest.mark.process
def test_the_saves_cheap_state_dicts_are_torchs_over_steps_a_schedule_and_a_restore(tmp_path: Path) -> None:
    for seen in ranks(tmp_path, "live", 2):
        assert seen["agreed"] == [True] * 5
        assert seen["renamed"]  # the cheap path was taken after the first call, not torch's every time
        assert seen["lrs"] == [seen["expectedLr"]] and seen["expectedLr"] < 1e-3


def test_the_fp32_replay_is_off_only_where_the_gathered_weights_are_low_for_good() -> None:
    logged: list[tuple[str, dict[str, Any]]] = []

    def log(event: str, **fields: Any) -> None:
        logged.append((event, fields))

    guard, fsdp = Guard(replaySteps=4), Parallelism(strategy="fsdp")
    assert sharding.replayable(guard, "fp16", fsdp, log).replay_steps == 0  # type: ignore[arg-type]
    assert logged and logged[0][0] == "replaySkipped" and "mixedPrecisionParam" in logged[0][1]["why"]
    fp32_gather = Parallelism.model_validate({"strategy": "fsdp", "fsdp": {"mixedPrecisionParam": "fp32"}})
    for precision, parallelism in (("bf16", fp32_gather), ("fp32", fsdp), ("fp16", Parallelism()), (None, fsdp)):
        assert sharding.replayable(guard, precision, parallelism, log).replay_steps == 4  # type: ignore[arg-type]


@pytest.mark.parametrize("max_norm", [None, 0])
def test_measuring_the_norm_leaves_the_gradients_as_they_are(max_norm: float | None) -> None:
    """No clipping asked (bf16 and fp32 apply every step, no GradScaler skips one): an inf in one
    gradient is the norm, and the other gradients are not scaled into NaN by inf/inf."""
    finite, blown = nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2))
    finite.grad, blown.grad = torch.tensor([3.0, 4.0, 0.0]), torch.tensor([math.inf, 1.0])
    total = sharding.clip_gradients([finite, blown], max_norm)
    assert total.item() == math.inf
    assert finite.grad.tolist() == [3.0, 4.0, 0.0] and blown.grad.tolist() == [math.inf, 1.0]


def test_clipping_scales_every_gradient_to_the_norm() -> None:
    weight = nn.Parameter(torch.zeros(2))
    weight.grad = torch.tensor([3.0, 4.0])
    assert sharding.clip_gradients([weight], 1.0).item() == pytest.approx(5.0)
    assert weight.grad.tolist() == pytest.approx([0.6, 0.8], rel=1e-5)
