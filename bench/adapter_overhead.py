"""Adapter overhead: the same Hugging Face Trainer and Lightning scripts, plain and on mpjob.

Plain: the framework as a user runs it (fp32: bf16 autocast is slow on CPUs without bf16
matrix units, and the adapter's per-step work does not depend on the precision; no
checkpoints, no progress bar). On mpjob: the same model, data and settings with the
adapter (`mpjob_hf.train` / `mpjob_lightning.fit`): the session's guard, progress lines,
metrics and interval reads included, checkpoints out of the timed window. A timing callback
in both marks each optimizer step; runs alternate A/B to share the machine's noise and the
median step time of each is compared, in CPU time of the training thread (on a machine shared
with other work, wall time mostly measures the neighbours). Usage: PYTHONPATH=. python bench/adapter_overhead.py
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.launch import AttemptLaunch
from mpjob_trainer import session as mpjob
from mpjob_trainer.adapters import hf as mpjob_hf
from mpjob_trainer.adapters import lightning as mpjob_lightning

STEPS, WARMUP, REPEATS, LOG_EVERY, BATCH = 50, 10, 3, 10, 16
LIGHTNING_BATCH = 256  # the classifier's batch: ~ a GPT step's time


class Tokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self) -> None:
        self.ids = torch.randint(0, 256, (4096, 64), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class HFTicks(TrainerCallback):
    def __init__(self, tick: Callable[[], None]) -> None:
        self.tick = tick

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        self.tick()


class LightningTicks(L.Callback):
    def __init__(self, tick: Callable[[], None]) -> None:
        self.tick = tick

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self.tick()


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 2048), nn.LayerNorm(2048), nn.GELU(), nn.Linear(2048, 10))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return nn.functional.cross_entropy(self.net(batch[0]).float(), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def gpt() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4))


def loader() -> DataLoader[tuple[torch.Tensor, ...]]:
    x = torch.randn(8192, 256, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x[:, :10].argmax(1)), batch_size=LIGHTNING_BATCH, shuffle=True)


def hf_plain(tick: Callable[[], None], folder: Path) -> None:
    args = TrainingArguments(
        output_dir=str(folder), max_steps=STEPS, per_device_train_batch_size=BATCH, use_cpu=True,
        save_strategy="no", logging_steps=LOG_EVERY, report_to=[], disable_tqdm=True,
    )  # fmt: skip
    Trainer(model=gpt(), args=args, train_dataset=Tokens(), callbacks=[HFTicks(tick)]).train()


def hf_mpjob(tick: Callable[[], None], folder: Path) -> None:
    with session(folder) as run:
        args = mpjob_hf.training_arguments(run, output_dir=str(folder), per_device_train_batch_size=BATCH)
        mpjob_hf.train(run, Trainer(model=gpt(), args=args, train_dataset=Tokens(), callbacks=[HFTicks(tick)]))


def lightning_plain(tick: Callable[[], None], folder: Path) -> None:
    torch.manual_seed(0)
    trainer = L.Trainer(
        max_steps=STEPS, precision="32-true", accelerator="cpu", devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[LightningTicks(tick)], log_every_n_steps=LOG_EVERY,
    )  # fmt: skip
    trainer.fit(Classifier(), train_dataloaders=loader())


def lightning_mpjob(tick: Callable[[], None], folder: Path) -> None:
    with session(folder, LIGHTNING_BATCH) as run:
        settings = mpjob_lightning.trainer_settings(
            run, logger=False, enable_model_summary=False, callbacks=[LightningTicks(tick)], gradient_clip_val=None
        )
        mpjob_lightning.fit(run, L.Trainer(**settings), Classifier(), train_dataloaders=loader())


def session(folder: Path, batch: int = BATCH) -> mpjob.Session:
    """The session of a bench job in fp32 whose micro-batch is `batch`, the script's loader's."""
    spec = MixedPrecisionJobSpec.model_validate(
        {
            "task": {"command": ["python", "bench.py"]},
            "training": {"steps": STEPS, "logEvery": LOG_EVERY, "batchSize": batch, "gradClipNorm": 1.0},
            "checkpoint": {"everySteps": 10**6},
            "precision": {"mode": "fp32"},
        }
    )
    launch = AttemptLaunch(job_name="bench", precision="fp32", checkpoint_dir=str(folder / "ckpt"), spec=spec)  # type: ignore[arg-type]
    return mpjob.start(launch=launch)


def timed(loop: Callable[[Callable[[], None], Path], None], folder: Path) -> float:
    """Median CPU time of an optimizer step after the warm-up (the final checkpoint excluded)."""
    marks: list[float] = []
    with tempfile.TemporaryDirectory(dir=folder) as tmp, contextlib.redirect_stdout(io.StringIO()):
        loop(lambda: marks.append(time.thread_time()), Path(tmp))
    gaps = [b - a for a, b in zip(marks[WARMUP:-1], marks[WARMUP + 1 : -1], strict=False)]
    return statistics.median(gaps)


def main() -> None:
    os.environ.update({"MPJOB_METRICS_PORT": "off", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MPJOB_TERMINATION_LOG"] = str(Path(tmp) / "report.json")
        for name, plain, adapted in (("hf", hf_plain, hf_mpjob), ("lightning", lightning_plain, lightning_mpjob)):
            pairs = [(timed(plain, Path(tmp)), timed(adapted, Path(tmp))) for _ in range(REPEATS)]
            base = statistics.median(p for p, _ in pairs)
            adapter = statistics.median(a for _, a in pairs)
            print(
                f"{name} (fp32, CPU, {torch.get_num_threads()} threads): plain {base * 1e3:.2f} ms/step, "
                f"with the mpjob adapter {adapter * 1e3:.2f} ms/step, overhead {100 * (adapter - base) / base:+.2f} %"
            )


if __name__ == "__main__":
    main()
