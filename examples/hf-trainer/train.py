"""A Hugging Face `Trainer` script run by mpjob: a small GPT-2 (`GPT2LMHeadModel` built from a
config, random weights) learns synthetic token sequences; nothing is downloaded.

The script is an ordinary Trainer script with three mpjob lines: `mpjob.start()`,
`training_arguments(run, ...)` and `mpjob_hf.train(run, trainer)`. The adapter gives the
Trainer the attempt's precision and GradScaler, and the session's guard, checkpoints (the
Trainer's own `checkpoint-N` folders, adopted with a sha256 manifest), resume, progress and
exit code. Run it with `mpjob run examples/hf-trainer/hf-trainer.yaml`.

`--overflow-at STEP` multiplies the first block's MLP output by 1e8 from optimizer step
STEP on: inf in fp16 (max 65504), finite in bf16 and fp32, so an fp16 attempt ends
NumericFault and the next one resumes in bf16 from the last good checkpoint. (At 1e6 the
output of a small random GPT-2's MLP, ~0.01, stayed under 65504 until the weights grew: the
first non-finite loss came 6 to 14 steps after STEP, seed by seed.)
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback

from mpjob_trainer import session as mpjob
from mpjob_trainer.adapters import hf as mpjob_hf
from mpjob_trainer.tasks.blowup import amplified  # eager even when the Trainer compiles the model


class Sequences(Dataset[dict[str, torch.Tensor]]):
    """Arithmetic token sequences (start, start + stride, ...) mod vocab: learnable, made here."""

    def __init__(self, samples: int, length: int, vocab: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (samples, 1), generator=gen)
        stride = torch.randint(1, 8, (samples, 1), generator=gen)
        self.ids = (start + stride * torch.arange(length)) % vocab

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


#: The injected overflow's gain: past fp16's 65504 from its first step, far inside bf16's range.
GAIN = 1e8


class Overflow(TrainerCallback):
    """From optimizer step `at` on, the first block's MLP output is GAIN times larger."""

    def __init__(self, model: GPT2LMHeadModel, at: int | None) -> None:
        self.at, self.gain = at, 1.0
        model.transformer.h[0].mlp.register_forward_hook(lambda mod, args, out: amplified(out, self.gain))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.gain = GAIN if self.at is not None and state.global_step >= self.at else 1.0


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--overflow-at", type=int, default=None, help="inject an fp16 overflow from this step on")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--embd", type=int, default=64)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--length", type=int, default=32)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--dropout", type=float, default=0.1)
    return p.parse_args()


def main() -> None:
    opts = parse()
    with mpjob.start() as run:
        config = GPT2Config(
            vocab_size=opts.vocab,
            n_positions=opts.length,
            n_embd=opts.embd,
            n_layer=opts.layers,
            n_head=4,
            resid_pdrop=opts.dropout,
            embd_pdrop=opts.dropout,
            attn_pdrop=opts.dropout,
            bos_token_id=0,
            eos_token_id=0,
        )
        model = GPT2LMHeadModel(config)  # random init, seeded by mpjob.start()
        run.set_sample_cost(flops=6 * model.num_parameters() * opts.length, tokens=opts.length)
        args = mpjob_hf.training_arguments(run, lr_scheduler_type="cosine")  # lr, weight decay, warm-up: the spec's
        data = Sequences(opts.samples, opts.length, opts.vocab, seed=run.spec.training.seed)
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Overflow(model, opts.overflow_at)])
        mpjob_hf.train(run, trainer)


if __name__ == "__main__":
    main()
