"""A tiny regression under either framework adapter, for the replay and quality-gate tests.

    python framework_script.py {hf|lightning} [--poison I] [--bad-gradient I] [--overflow-at STEP]
                                              [--overflow-until STEP]
                                              [--batchnorm] [--deep] [--slow P]
                                              [--quarantine STEP,...] [--empty-step STEP]
                                              [--spike-at STEP] [--loss-func] [--val-output K]
                                              [--log-losses] [--truncate STEP:FILE[:rehash]]

`--poison I`: sample I's input is NaN (bad data: non-finite in every precision, fp32 too).
`--bad-gradient I`: sample I's loss is finite and its gradient is not (the square root of a
difference that is 0 added to it): bad data that spoils the weights at its step, in fp32 too.
`--overflow-at STEP`: from optimizer step STEP on, an inner activation is 1e6 times larger:
inf in fp16, finite in fp32 (a precision's fault), up to step `--overflow-until` (excluded) if
given. `--batchnorm`: a BatchNorm after the LayerNorm (one fp16 overflow leaves its running
statistics NaN for good, GradScaler keeping the weights finite). `--deep`: a 32x32 linear between the first
and the last (one an fp8 attempt converts: it keeps those two in bf16), and the script logs
the dtype the first linear's output has in training on stderr (`activation dtype: D`).
`--slow P` (Lightning): each training step sleeps 0.3 s while the session's precision is P, a
device where P is slow, for an `auto` attempt's measurement. Both have an evaluation set
(the first 64 samples), so `spec.validation` can run. Lightning reads the samples in order,
from the global step on (a resumed or re-entered fit reads on where it stood): sample I is in
step I // batch of the first epoch.
`--quarantine STEP,...`: the run starts with these optimizer steps (0-based) quarantined whole
(the adapters train on nothing there). `--spike-at STEP`: at steps STEP..STEP+2 the output is
1e3 times larger, a finite loss spike (guard.spike). `--empty-step STEP` (Lightning): the script's own
`training_step` returns None at STEP, a run whose data has no batch there. `--loss-func` (HF): the
Trainer computes the loss with a `compute_loss_func` (it takes the labels): the model computes
no loss of its own, it returns its prediction only, labels or not. `--val-output K`
(Lightning): `validation_step` returns None (Lightning's "skip this batch") at odd batch
indexes (`odd-none`) or at every one (`none`), or a dict without "loss" (`dict`). `--log-losses`
(Lightning): `training_step` logs "train_loss" and `validation_step` "val_loss" (`self.log`); each
value the module logs is printed on stderr with the global step (`logged: {"name", "step", "value"}`),
and the Trainer's `callback_metrics` after fit (`callback metrics: {JSON}`); Lightning's own
validation loop never runs (the epoch does not end).
`--truncate STEP:FILE` (Lightning): at optimizer step STEP, once, FILE (a file of a checkpoint's
framework folder) is cut to half its length once its checkpoint is committed: damage after the save;
with `:rehash`, the manifest is then written again over the cut file (it passes its sha256: a
checkpoint bad inside, as a manifest recomputed over a damaged file leaves it).
$FRAMEWORK_SCRIPT_STEP_SECONDS: each optimizer step sleeps that long (a test can stop the run
mid-way), without changing the command, which checkpoints' config digest names: a run that
resumes the paced one's checkpoints need not be paced.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from mpjob_trainer import session as mpjob

FEATURES, SAMPLES = 8, 512


class Regression(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, poison: int | None, bad_gradient: int | None = None) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(SAMPLES, FEATURES, generator=gen)
        self.y = self.x.sum(1, keepdim=True).sin()
        self.bad_gradient = bad_gradient
        if poison is not None:
            self.x[poison] = float("nan")

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = {"x": self.x[i], "labels": self.y[i]}
        return item if self.bad_gradient is None else {**item, "bad": torch.tensor(i == self.bad_gradient)}


def log_activation_once(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
    """The first training forward's activation dtype: what the framework's autocast made of it."""
    if module.training and not getattr(module, "logged", False):
        module.logged = True  # type: ignore[assignment]
        print(f"activation dtype: {str(output.dtype).removeprefix('torch.')}", file=sys.stderr, flush=True)


class Net(nn.Module):
    def __init__(
        self,
        overflow_at: int | None,
        *,
        deep: bool = False,
        spike_at: int | None = None,
        predicts_only: bool = False,
        overflow_until: int | None = None,
        batchnorm: bool = False,
    ) -> None:
        super().__init__()
        inp, norm, out = nn.Linear(FEATURES, 32), nn.LayerNorm(32), nn.Linear(32, 1)
        # Registered in the order they run (fp8 keeps the first and last linear in bf16), made
        # after the others (a run without it draws the same initial weights).
        self.inp, self.norm = inp, norm
        self.mid = nn.Sequential(nn.Linear(32, 32), nn.ReLU()) if deep else nn.Identity()
        self.out = out
        self.bn = nn.BatchNorm1d(32) if batchnorm else nn.Identity()  # no random draws: the same weights
        self.overflow_until = overflow_until
        self.overflow_at, self.step, self.predicts_only = overflow_at, 0, predicts_only
        self.spikes = range(spike_at, spike_at + 3) if spike_at is not None else range(0)
        if deep:
            self.inp.register_forward_hook(log_activation_once)

    def forward(
        self, x: torch.Tensor, labels: torch.Tensor | None = None, bad: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        until = self.overflow_until if self.overflow_until is not None else self.step + 1
        gain = 1e6 if self.overflow_at is not None and self.overflow_at <= self.step < until else 1.0
        h = self.out(self.mid(torch.relu(self.bn(self.norm(self.inp(x) * gain)))))
        h = h * 1e3 if self.step in self.spikes else h
        if labels is None or self.predicts_only:
            return {"prediction": h}
        loss = squared_error(h, labels)
        if bad is not None and bool(bad.any()):  # sqrt(0) adds nothing to the loss; its gradient is inf
            loss = loss + torch.sqrt(h[bad] - h[bad].detach()).sum()
        return {"loss": loss}


def squared_error(prediction: torch.Tensor, labels: torch.Tensor, **_: Any) -> torch.Tensor:
    return nn.functional.mse_loss(prediction.float(), labels)


def squared_error_of(outputs: dict[str, torch.Tensor], labels: torch.Tensor, **_: Any) -> torch.Tensor:
    """A Trainer's `compute_loss_func`."""
    return squared_error(outputs["prediction"], labels)


class InOrder(Sampler[list[int]]):
    """Endless batches of consecutive samples from batch `start` on (wrapping at the end); with
    several processes, rank r of w takes global batches r, r + w, ..."""

    def __init__(self, batch: int, start: int, *, rank: int = 0, world: int = 1) -> None:
        self.batch, self.start, self.rank, self.world = batch, start, rank, world

    def __iter__(self) -> Any:
        for b in range(self.start, self.start + 10**9):
            first = (b * self.world + self.rank) * self.batch
            yield [(first + j) % SAMPLES for j in range(self.batch)]


def hf(run: Any, net: Net, data: Regression, pace: float = 0.0, loss_func: bool = False) -> None:
    from transformers import Trainer, TrainerCallback

    from mpjob_trainer.adapters import hf as mpjob_hf

    class Steps(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            net.step = state.global_step
            time.sleep(pace)

    args = mpjob_hf.training_arguments(run, remove_unused_columns=False, dataloader_num_workers=0)
    eval_set = torch.utils.data.Subset(data, range(64))
    loss = {"compute_loss_func": squared_error_of} if loss_func else {}
    trainer = Trainer(model=net, args=args, train_dataset=data, eval_dataset=eval_set, callbacks=[Steps()], **loss)
    mpjob_hf.train(run, trainer)


def logged_steps(stderr: str, name: str) -> list[int]:
    """The global steps at which the module logged `name` (`--log-losses`), in the order logged."""
    found = (json.loads(line.removeprefix("logged: ")) for line in stderr.splitlines() if line.startswith("logged: "))
    return [entry["step"] for entry in found if entry["name"] == name]


def truncate(file: Path, rehash: bool) -> None:
    """Cut `file` to half its length once its checkpoint's manifest is there (written in the
    background); `rehash`: the manifest then names the cut file's sha256 and size."""
    folder = file.parents[1]
    deadline = time.monotonic() + 60
    while not (folder / "manifest.json").exists():
        assert time.monotonic() < deadline, f"{folder} was never committed"
        time.sleep(0.01)
    data = file.read_bytes()[: file.stat().st_size // 2]
    file.write_bytes(data)
    if rehash:
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["files"][str(file.relative_to(folder))] = {
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
        }
        (folder / "manifest.json").write_text(json.dumps(manifest))


def lightning(run: Any, net: Net, data: Regression, opts: argparse.Namespace) -> None:
    import lightning as L

    from mpjob_trainer.adapters import lightning as mpjob_lightning

    batch = run.spec.training.batch_size

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def training_step(self, b: dict[str, torch.Tensor], i: int) -> torch.Tensor | None:
            net.step = self.global_step
            if opts.truncate and self.global_step == int(opts.truncate.split(":")[0]):
                at, rehash = opts.truncate.split(":", 1)[1], opts.truncate.endswith(":rehash")
                truncate(Path(at.removesuffix(":rehash")), rehash)
                opts.truncate = None  # once: the step runs again after a rollback
            if self.global_step == opts.empty_step:
                return None
            time.sleep(0.3 if run.precision == opts.slow else opts.pace)
            loss = net(**b)["loss"]
            if opts.log_losses:
                self.log("train_loss", loss)
            return loss

        def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
            logged = {"name": name, "step": self.global_step, "value": float(value)}
            print(f"logged: {json.dumps(logged)}", file=sys.stderr, flush=True)
            super().log(name, value, *args, **kwargs)

        def validation_step(self, b: dict[str, torch.Tensor], i: int) -> Any:
            if opts.val_output == "dict":
                return {"prediction": net(b["x"])["prediction"]}
            skipped = opts.val_output == "none" or (opts.val_output == "odd-none" and i % 2)
            loss = None if skipped else net(**b)["loss"]
            if opts.log_losses and loss is not None:
                self.log("val_loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=run.spec.training.learning_rate)

        def train_dataloader(self) -> DataLoader[Any]:
            start = self.trainer.global_step * self.trainer.accumulate_grad_batches
            # Its own generator: making the iterator draws no seed from the global one, which
            # the session restored (Lightning saves no RNG state; docs/frameworks.md).
            order = InOrder(batch, start, rank=run.world.rank, world=run.world.size)
            return DataLoader(data, batch_sampler=order, generator=torch.Generator().manual_seed(0))

        def val_dataloader(self) -> DataLoader[Any]:
            return DataLoader(torch.utils.data.Subset(data, range(64)), batch_size=batch)

    settings = mpjob_lightning.trainer_settings(run, logger=False, enable_model_summary=False)
    trainer = L.Trainer(**settings, use_distributed_sampler=False)  # InOrder shares the data out
    mpjob_lightning.fit(run, trainer, Module())
    if opts.log_losses:
        metrics = {key: float(value) for key, value in trainer.callback_metrics.items()}
        print(f"callback metrics: {json.dumps(metrics)}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=["hf", "lightning"])
    parser.add_argument("--poison", type=int, default=None)
    parser.add_argument("--bad-gradient", type=int, default=None)
    parser.add_argument("--overflow-at", type=int, default=None)
    parser.add_argument("--overflow-until", type=int, default=None)
    parser.add_argument("--batchnorm", action="store_true")
    parser.add_argument("--deep", action="store_true")
    parser.add_argument("--slow", default=None)
    parser.add_argument("--quarantine", default=None)
    parser.add_argument("--spike-at", type=int, default=None)
    parser.add_argument("--empty-step", type=int, default=None)
    parser.add_argument("--loss-func", action="store_true")
    parser.add_argument("--val-output", choices=["odd-none", "none", "dict"], default=None)
    parser.add_argument("--log-losses", action="store_true")
    parser.add_argument("--truncate", default=None)
    parser.set_defaults(pace=float(os.environ.get("FRAMEWORK_SCRIPT_STEP_SECONDS", "0")))
    opts = parser.parse_args()
    with mpjob.start() as run:
        for step in opts.quarantine.split(",") if opts.quarantine else []:
            run.quarantined.add(int(step), "data")
        net = Net(
            opts.overflow_at,
            deep=opts.deep,
            spike_at=opts.spike_at,
            predicts_only=opts.loss_func,
            overflow_until=opts.overflow_until,
            batchnorm=opts.batchnorm,
        )
        data = Regression(opts.poison, opts.bad_gradient)
        if opts.framework == "hf":
            hf(run, net, data, opts.pace, opts.loss_func)
        else:
            lightning(run, net, data, opts)


if __name__ == "__main__":
    main()
