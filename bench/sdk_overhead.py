"""SDK overhead: the same AMP training loop written plainly and on the mpjob SDK.

The plain loop is nanoGPT's (bench/baseline.py's update in fp16; autocast + step in bf16)
with the loss read every `LOG_EVERY` steps. The SDK loop makes the calls a user's loop makes
(`run.autocast`, `run.backward`, `run.step`, `run.end_step`): guard, progress, metrics and
the interval read included, checkpoints out of the timed window. Runs alternate A/B to share
the machine's noise; the median step time of each is compared, in CPU time of the training
thread (`time.thread_time`: on a machine shared with other work, wall time mostly measures
the neighbours) and in wall time.

Host reads of device values (the syncs on a GPU: `.item()`, `.tolist()`, `float()`,
`bool()` of a tensor) are counted per step in a separate, untimed pass; on a GPU,
`torch.cuda.set_sync_debug_mode` would count the same. Usage: PYTHONPATH=. python bench/sdk_overhead.py
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from bench.baseline import amp_update
from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.launch import AttemptLaunch
from mpjob_trainer import session as mpjob
from mpjob_trainer.tasks.gpt import make_task

STEPS, WARMUP, REPEATS, LOG_EVERY = 40, 5, 5, 10
MODEL = {"nLayer": 1, "nHead": 2, "nEmbd": 64, "blockSize": 32}
HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__")


def batch(task: object) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = [task.dataset[i] for i in range(16)]  # type: ignore[attr-defined]
    return torch.stack([a for a, _ in pairs]), torch.stack([b for _, b in pairs])


def plain(precision: str, steps: int, tick: Callable[[], None]) -> None:
    torch.manual_seed(0)
    task = make_task(MODEL)
    model, (x, y) = task.model, batch(task)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    for step in range(steps):
        with torch.autocast("cpu", dtype=dtype):
            loss = task.loss(model(x), y)
        if precision == "fp16":
            amp_update(loss, model, opt, scaler)
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        if (step + 1) % LOG_EVERY == 0:
            loss.item()
        tick()


def on_sdk(
    precision: str, steps: int, tick: Callable[[], None], folder: Path, *, guard: dict[str, Any] | None = None
) -> None:
    """The SDK loop for `steps` steps, `tick` after each; `guard`: the spec's precision.guard."""
    spec = MixedPrecisionJobSpec.model_validate(
        {
            "task": {"command": ["python", "bench.py"]},
            "training": {"steps": 10**6, "logEvery": LOG_EVERY},
            "checkpoint": {"everySteps": 10**6},
            "precision": {"mode": precision, **({"guard": guard} if guard else {})},
        }
    )
    launch = AttemptLaunch(job_name="bench", precision=precision, checkpoint_dir=str(folder), spec=spec)  # type: ignore[arg-type]
    with contextlib.redirect_stdout(io.StringIO()), mpjob.start(launch=launch) as run:
        task = make_task(MODEL)
        model, (x, y) = task.model, batch(task)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        start = run.resume(model=model, optimizer=opt)
        for step in range(start, start + steps):
            with run.autocast():
                loss = task.loss(model(x), y)
            run.backward(loss)
            run.step(opt, clip_norm=1.0)
            run.end_step(step + 1, loss=loss, samples=16)
            tick()


def timed(loop: Callable[[Callable[[], None]], None]) -> tuple[float, float]:
    """Median (thread CPU, wall) time of a step after the warm-up."""
    marks: list[tuple[float, float]] = []
    loop(lambda: marks.append((time.thread_time(), time.perf_counter())))
    pairs = list(zip(marks[WARMUP:], marks[WARMUP + 1 :], strict=False))
    cpu = statistics.median(b[0] - a[0] for a, b in pairs)
    wall = statistics.median(b[1] - a[1] for a, b in pairs)
    return cpu, wall


@contextlib.contextmanager
def counting_host_reads() -> Iterator[list[int]]:
    count = [0]
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counted(original: Callable[..., object]) -> Callable[..., object]:
        def wrapper(self: torch.Tensor, *args: object, **kwargs: object) -> object:
            count[0] += 1
            return original(self, *args, **kwargs)

        return wrapper

    for name, original in originals.items():
        setattr(torch.Tensor, name, counted(original))
    try:
        yield count
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def host_reads(loop: Callable[[Callable[[], None]], None]) -> tuple[float, float]:
    """Host reads in an ordinary step and in a step that ends a log interval (medians)."""
    marks: list[int] = []
    with counting_host_reads() as count:
        loop(lambda: marks.append(count[0]))
    per_step = [b - a for a, b in itertools.pairwise(marks)]  # per_step[i]: step number i + 2
    at_log = [n for i, n in enumerate(per_step) if (i + 2) % LOG_EVERY == 0]
    ordinary = [n for i, n in enumerate(per_step) if (i + 2) % LOG_EVERY != 0]
    return statistics.median(ordinary), statistics.median(at_log)


def compare(precision: str, folder: Path) -> str:
    def a(tick: Callable[[], None]) -> None:
        plain(precision, STEPS, tick)

    def b(tick: Callable[[], None]) -> None:
        on_sdk(precision, STEPS, tick, folder)

    runs = [(timed(a), timed(b)) for _ in range(REPEATS)]
    cpu = [statistics.median(r[k][0] for r in runs) for k in (0, 1)]
    wall = [statistics.median(r[k][1] for r in runs) for k in (0, 1)]
    (plain_step, plain_log), (sdk_step, sdk_log) = host_reads(a), host_reads(b)
    return (
        f"{precision}: CPU/step plain {cpu[0] * 1e3:.2f} ms, SDK {cpu[1] * 1e3:.2f} ms "
        f"({100 * (cpu[1] - cpu[0]) / cpu[0]:+.2f} %); wall/step {wall[0] * 1e3:.2f} vs {wall[1] * 1e3:.2f} ms "
        f"({100 * (wall[1] - wall[0]) / wall[0]:+.2f} %); host reads per step {plain_step:g} vs {sdk_step:g}, "
        f"at a log step {plain_log:g} vs {sdk_log:g}"
    )


def main() -> None:
    os.environ.update({"MPJOB_METRICS_PORT": "off", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MPJOB_TERMINATION_LOG"] = str(Path(tmp) / "report.json")
        print(f"torch {torch.__version__}, {STEPS} steps x {REPEATS}, model {MODEL}, log every {LOG_EVERY}")
        for precision in ("fp16", "bf16"):
            print(compare(precision, Path(tmp) / precision))


if __name__ == "__main__":
    main()
