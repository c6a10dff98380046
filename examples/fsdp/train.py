"""A plain PyTorch transformer trained sharded (FSDP2) by mpjob: every process of the attempt
holds a shard of the weights, gradients and AdamW state instead of a full replica.

The only mpjob-specific line about sharding is `run.wrap(model, blocks=model.layers)`: with
`spec.parallelism.strategy: fsdp` it applies `fully_shard` to each layer and to the root, with
the attempt's mixed-precision policy (gather and compute in fp16/bf16, reduce in fp32, fp32
sharded masters; LayerNorms in fp32), and recomputes the layers' activations in the backward as
`spec.parallelism.activationCheckpointing` says. Under `ddp` the same script trains replicas.
Create the optimizer after `run.wrap`: FSDP2 replaces the parameters with sharded ones.

The task: continue a sequence of tokens that counts up modulo the vocabulary from a random
start, learnable in a few hundred steps. Each sample is addressed by its position in the data
stream, and every step draws the next ones from `run.samples_seen` (the samples all ranks
consumed, restored from the checkpoint): a resume continues with the very next sample, also on
another world size (`workers` or `processesPerWorker` edited between attempts, docs/sdk.md).

`--overflow-at STEP` makes the embeddings 1e6 times larger from STEP on: finite in bf16 and
fp32, inf in fp16 (max 65504). The fp16 attempt then ends NumericFault and the next attempt
resumes in bf16 from the last good checkpoint.

AdamW's learning rate (after a linear warm-up) and weight decay are the job's
training.learningRate, weightDecay and warmupSteps; `--lr`, when given, wins over learningRate.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from mpjob_trainer import session as mpjob


class Transformer(nn.Module):
    """Token and position embeddings, `layers` pre-norm encoder layers with a causal mask, a head."""

    def __init__(self, *, vocab: int, width: int, heads: int, layers: int, context: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        self.mask = nn.Transformer.generate_square_subsequent_mask(context)
        self.gain = 1.0

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = (self.embed(tokens) + self.position(torch.arange(t, device=tokens.device))) * self.gain
        mask = self.mask[:t, :t].to(tokens.device)
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


def first_token(position: int, *, vocab: int, seed: int) -> int:
    """Where the sample at `position` of the stream starts counting: drawn from its position alone."""
    return int(torch.randint(0, vocab, (1,), generator=torch.Generator().manual_seed(seed * 1_000_003 + position)))


def batch(first: int, *, size: int, context: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples at positions `first` to `first + size - 1`: sequences counting up, the same
    whichever rank and step draw them."""
    starts = torch.tensor([[first_token(k, vocab=vocab, seed=seed)] for k in range(first, first + size)])
    seq = (starts + torch.arange(context + 1)) % vocab
    return seq[:, :-1], seq[:, 1:]


def warm_up(optimizer: torch.optim.Optimizer, lr: float, *, step: int, steps: int) -> None:
    """Step `step`'s learning rate: a linear warm-up over `steps` steps to `lr`, then `lr`. Set
    from the step alone, so a resumed attempt goes on with the very same rates."""
    for group in optimizer.param_groups:
        group["lr"] = lr * min(1.0, (step + 1) / max(1, steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--context", type=int, default=32)
    parser.add_argument("--lr", type=float, default=None, help="peak LR (default: training.learningRate)")
    parser.add_argument("--overflow-at", type=int, default=None, help="inject an fp16 overflow from this step on")
    args = parser.parse_args()

    with mpjob.start() as run:
        model = Transformer(
            vocab=args.vocab, width=args.width, heads=args.heads, layers=args.layers, context=args.context
        ).to(run.device)
        run.keep_fp32(model)
        net = run.wrap(model, blocks=list(model.layers))  # FSDP2 per layer under parallelism.strategy: fsdp
        tr = run.spec.training  # the job sets the optimizer; --lr, when given, wins
        lr = tr.learning_rate if args.lr is None else args.lr
        optimizer = run.adamw(model, lr=lr, weight_decay=tr.weight_decay)  # after wrap: over the sharded parameters
        start = run.resume(model=model, optimizer=optimizer)  # also restores run.samples_seen
        size, seed = tr.batch_size, tr.seed
        for step in range(start, run.total_steps):
            model.gain = 1e6 if args.overflow_at is not None and step >= args.overflow_at else 1.0
            warm_up(optimizer, lr, step=step, steps=tr.warmup_steps)
            # This rank's share of the next samples: the position is in samples, not step x batch x
            # world, so it stays right when the world size changed since the checkpoint.
            first = run.samples_seen + run.world.rank * size
            x, y = batch(first, size=size, context=args.context, vocab=args.vocab, seed=seed)
            with run.autocast():
                loss = nn.functional.cross_entropy(net(x.to(run.device)).flatten(0, 1), y.to(run.device).flatten())
            run.backward(loss)
            run.step(optimizer, clip_norm=tr.grad_clip_norm)
            run.end_step(step + 1, loss=loss, samples=size * run.world.size)  # advances run.samples_seen


if __name__ == "__main__":
    main()
