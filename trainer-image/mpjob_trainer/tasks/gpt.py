"""The built-in `gpt` workload: a decoder-only transformer on a byte-level corpus.

One readable file in the spirit of nanoGPT. Args (camelCase, all optional): nLayer, nHead,
nEmbd, blockSize, dropout, corpusBytes, overflowAtStep, overflowGain, overflowUntilStep.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from mpjob_trainer.tasks import Task, arg, check_args
from mpjob_trainer.tasks.blowup import ActivationBlowUp
from mpjob_trainer.tasks.corpus import corpus

VOCAB = 256  # bytes


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
    def __init__(
        self, n_layer: int, n_head: int, n_embd: int, block_size: int, dropout: float, blowup: ActivationBlowUp
    ) -> None:
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(VOCAB, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        # The blow-up sits in the first block's MLP; the others use a plain GELU.
        self.blocks = nn.ModuleList(
            Block(n_embd, n_head, dropout, blowup if i == 0 else nn.GELU()) for i in range(n_layer)
        )
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, VOCAB, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

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
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class ByteWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Window i of the corpus: bytes [i*stride, i*stride+blockSize) and the next-byte targets."""

    def __init__(self, data: bytes, block_size: int) -> None:
        self.data = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        self.block_size = block_size
        self.stride = max(1, block_size // 2)
        self.count = (len(self.data) - block_size - 1) // self.stride

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.stride
        chunk = self.data[start : start + self.block_size + 1]
        return chunk[:-1], chunk[1:]


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


KNOWN = {
    "nLayer",
    "nHead",
    "nEmbd",
    "blockSize",
    "dropout",
    "corpusBytes",
    "overflowAtStep",
    "overflowGain",
    "overflowUntilStep",
}


def make_task(args: dict[str, Any]) -> Task:
    check_args(args, KNOWN, "gpt")
    n_layer = arg(args, "nLayer", 2, int)
    n_head = arg(args, "nHead", 2, int)
    n_embd = arg(args, "nEmbd", 64, int)
    block_size = arg(args, "blockSize", 64, int)
    if n_layer < 1 or n_head < 1 or n_embd < 1 or block_size < 2:
        raise ValueError("task.args: nLayer, nHead, nEmbd must be >= 1 and blockSize >= 2")
    if n_embd % n_head:
        raise ValueError(f"task.args.nEmbd ({n_embd}) must be a multiple of nHead ({n_head})")
    blowup = ActivationBlowUp(
        arg(args, "overflowAtStep", None, int),
        arg(args, "overflowGain", 1e6, float),
        arg(args, "overflowUntilStep", None, int),
    )
    model = GPT(n_layer, n_head, n_embd, block_size, arg(args, "dropout", 0.0, float), blowup)
    dataset = ByteWindows(corpus(arg(args, "corpusBytes", 200_000, int)), block_size)
    n_params = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    # 6N per token for the matmuls plus attention, as in the PaLM appendix / nanoGPT.
    flops_per_token = 6 * n_params + 12 * n_layer * n_embd * block_size
    return Task(
        model=model,
        dataset=dataset,
        # Held-out text from the same grammar (another seed): the quality gate's evaluation set.
        eval_dataset=ByteWindows(corpus(max(4 * (block_size + 1), 20_000), seed=4321), block_size),
        loss=lm_loss,
        flops_per_sample=float(flops_per_token * block_size),
        tokens_per_sample=block_size,
        set_step=blowup.set_step,
    )
