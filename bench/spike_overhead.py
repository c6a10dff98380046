"""Loss spike detector overhead (spec.precision.guard.spike): the same SDK loop with the
detector off and on (action: rollback), as an interleaved A/B.

The loop is bench/sdk_overhead.py's SDK loop (`run.autocast`, `run.backward`, `run.step`,
`run.end_step`, the loss read at log steps), GPT 1x64, batch 16x32, CPU autocast. Runs
alternate off/on to share the machine's noise; the median step time of each is compared, in
CPU time of the training thread and in wall time (see sdk_overhead.py for why both). Host
reads of device values (the syncs on a GPU) are counted per step in a separate, untimed
pass, in an ordinary step and in a step that ends a log interval: the detector must add none
per step (its numbers ride the guard's one packed read at log steps).
Usage: PYTHONPATH=. python bench/spike_overhead.py
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.sdk_overhead import LOG_EVERY, MODEL, REPEATS, STEPS, host_reads, on_sdk, timed
from mpjob_contract.skipping import SpikeSpec
from mpjob_trainer.spike import SpikeDetector


def compare(precision: str, folder: Path) -> str:
    def loop(spike: str) -> Callable[[Callable[[], None]], None]:
        guard = {"spike": {"action": spike, "window": 8}}
        return lambda tick: on_sdk(precision, STEPS, tick, folder / spike, guard=guard)

    runs = [(timed(loop("off")), timed(loop("rollback"))) for _ in range(REPEATS)]
    cpu = [statistics.median(r[k][0] for r in runs) for k in (0, 1)]
    wall = [statistics.median(r[k][1] for r in runs) for k in (0, 1)]
    (off_step, off_log), (on_step, on_log) = host_reads(loop("off")), host_reads(loop("rollback"))
    return (
        f"{precision}: CPU/step off {cpu[0] * 1e3:.2f} ms, on {cpu[1] * 1e3:.2f} ms "
        f"({100 * (cpu[1] - cpu[0]) / cpu[0]:+.2f} %); wall/step {wall[0] * 1e3:.2f} vs {wall[1] * 1e3:.2f} ms "
        f"({100 * (wall[1] - wall[0]) / wall[0]:+.2f} %); host reads per step {off_step:g} vs {on_step:g}, "
        f"at a log step {off_log:g} vs {on_log:g}"
    )


def observe_cost(calls: int = 2000) -> float:
    """The detector's own per-step work alone (thread CPU seconds per observe, median of 5): a
    bound that noise on a loaded machine cannot blur."""
    detector = SpikeDetector(SpikeSpec(action="rollback", window=128), torch.device("cpu"))
    loss = torch.tensor(1.0)
    samples = []
    for _ in range(5):
        began = time.thread_time()
        for index in range(calls):
            detector.observe(loss, index)
        samples.append((time.thread_time() - began) / calls)
    return statistics.median(samples)


def main() -> None:
    os.environ.update({"MPJOB_METRICS_PORT": "off", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MPJOB_TERMINATION_LOG"] = str(Path(tmp) / "report.json")
        print(f"torch {torch.__version__}, {STEPS} steps x {REPEATS}, model {MODEL}, log every {LOG_EVERY}")
        print(f"detector alone: {observe_cost() * 1e6:.1f} us of thread CPU per step (window 128)")
        for precision in ("fp16", "bf16"):
            print(compare(precision, Path(tmp) / precision))


if __name__ == "__main__":
    main()
