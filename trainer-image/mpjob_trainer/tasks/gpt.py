"""The built-in `gpt` workload: a decoder-only transformer on a byte-level corpus, or on
synthetic tokens of a real vocabulary's size.

One readable file in the spirit of nanoGPT. Args (camelCase, all optional):
- shape: nLayer (2), nHead (2), nEmbd (64), blockSize (64), vocabSize (256, at least 256;
  50304 is GPT-2's, padded to a multiple of 64), dropout (0);
- data: `data: text` (default; the byte-level corpus of mpjob_trainer.tasks.corpus, sized by
  corpusBytes, 200000) or `data: random` (token ids drawn uniformly over the vocabulary from a
  seeded generator, `samples` windows of blockSize + 1, default 1024);
- faults: overflowAtStep, overflowGain, overflowUntilStep (mpjob_trainer.tasks.blowup);
  stepDelay (mpjob_trainer.tasks.faults: seconds per forward pass in a precision).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from mpjob_contract.builtin_args import GptShape, arg, gpt_data, gpt_shape, step_delays, text_stride, text_windows
from mpjob_trainer.tasks import Task, task_args
from mpjob_trainer.tasks.blowup import ActivationBlowUp
from mpjob_trainer.tasks.corpus import corpus
from mpjob_trainer.tasks.faults import PrecisionDelay


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float, act: nn.Module) -> None:
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.act = act
        self.proj = nn.Linear(4 * n_embd, n_embd)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, act: nn.Module) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, dropout, act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GptShape, blowup: ActivationBlowUp, delay: PrecisionDelay | None = None) -> None:
        super().__init__()
        self.config = config
        self.delay = delay or PrecisionDelay({})  # no parameters: the state dict is the same either way
        self.block_size = config.block_size
        c = config
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd)
        self.drop = nn.Dropout(c.dropout)
        # The blow-up sits in the first block's MLP; the others use a plain GELU.
        self.blocks = nn.ModuleList(
            Block(c.n_embd, c.n_head, c.dropout, blowup if i == 0 else nn.GELU()) for i in range(c.n_layer)
        )
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

    def flops_per_token(self) -> int:
        """Training FLOPs per token as nanoGPT's estimate_mfu counts them (PaLM, appendix B):
        6N for the matmuls, N without the position embedding (the tied token embedding counts,
        as the lm_head), plus 12 L H Q T for attention."""
        c = self.config
        n = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()
        layers, heads, head_dim, seq = c.n_layer, c.n_head, c.n_embd // c.n_head, c.block_size
        return 6 * n + 12 * layers * heads * head_dim * seq

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.delay(self.wte(idx) + self.wpe(pos)))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class ByteWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Window i of the corpus: bytes [i*stride, i*stride+blockSize) and the next-byte targets."""

    def __init__(self, data: bytes, block_size: int) -> None:
        self.data = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        self.block_size = block_size
        self.stride = text_stride(block_size)
        self.count = text_windows(len(self.data), block_size)  # as builtin_args checks task.args with

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.stride
        chunk = self.data[start : start + self.block_size + 1]
        return chunk[:-1], chunk[1:]


class RandomTokens(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """`count` windows of blockSize + 1 token ids drawn uniformly from [0, vocab) by a seeded
    generator: data of a real vocabulary's shape (GPT-2's 50304) with nothing to download and
    nothing to learn beyond the uniform prior (the loss stays near ln vocab)."""

    def __init__(self, count: int, block_size: int, vocab_size: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        # int32 at rest (half the memory); the model takes int64 ids.
        self.tokens = torch.randint(vocab_size, (count, block_size + 1), generator=gen, dtype=torch.int32)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.tokens[i].long()
        return window[:-1], window[1:]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


#: Seeds of the synthetic data: the same bytes or tokens in every run, process and attempt.
TRAIN_SEED, EVAL_SEED = 1234, 4321


def datasets(args: dict[str, Any], c: GptShape) -> tuple[Dataset[Any], Dataset[Any]]:
    """(training set, evaluation set) of task.args.data: the byte-level text corpus, or
    uniformly random token ids over the whole vocabulary (`samples` windows)."""
    data = gpt_data(args, c.block_size)
    if data.kind == "text":
        train: Dataset[Any] = ByteWindows(corpus(data.corpus_bytes), c.block_size)
        # Held-out text from the same grammar (another seed): byte ids, valid for any vocabSize.
        held_out = ByteWindows(corpus(max(4 * (c.block_size + 1), 20_000), seed=EVAL_SEED), c.block_size)
        return train, held_out
    train = RandomTokens(data.samples, c.block_size, c.vocab_size, TRAIN_SEED)
    return train, RandomTokens(64, c.block_size, c.vocab_size, EVAL_SEED)


def make_task(args: dict[str, Any]) -> Task:
    config = gpt_shape(task_args("gpt", args))
    blowup = ActivationBlowUp(
        arg(args, "overflowAtStep", None, int),
        arg(args, "overflowGain", 1e6, float),
        arg(args, "overflowUntilStep", None, int),
    )
    model = GPT(config, blowup, PrecisionDelay(step_delays(args.get("stepDelay"))))
    train, held_out = datasets(args, config)
    return Task(
        model=model,
        dataset=train,
        eval_dataset=held_out,  # the quality gate's evaluation set
        loss=lm_loss,
        flops_per_sample=float(model.flops_per_token() * config.block_size),
        tokens_per_sample=config.block_size,
        set_step=blowup.set_step,
        blocks=list(model.blocks),  # FSDP2 shards per transformer block
    )
