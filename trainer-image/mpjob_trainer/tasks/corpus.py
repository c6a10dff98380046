"""A byte-level training corpus generated deterministically (nothing is downloaded).

Sentences are drawn from a small grammar with a fixed seed, so every run and every worker
sees the same bytes, and a GPT can visibly learn them (loss falls from ~5.5 towards ~1).
"""

from __future__ import annotations

import random
from functools import lru_cache

_SUBJECTS = [
    "the operator",
    "a trainer",
    "the loss scale",
    "every worker",
    "the checkpoint",
    "a gradient",
    "the cluster",
    "each attempt",
    "the scheduler",
    "a tensor core",
]
_VERBS = ["watches", "restores", "scales", "skips", "writes", "reads", "halves", "doubles", "resumes", "measures"]
_OBJECTS = [
    "the master weights",
    "an overflow",
    "the next precision",
    "a good step",
    "the optimizer state",
    "sixteen bits",
    "the learning rate",
    "a finite loss",
    "the manifest",
    "every sample",
]
_ENDINGS = [".", " again.", " at every step.", " without a sync.", " in bf16.", " in fp16."]


@lru_cache(maxsize=4)
def corpus(size: int = 200_000, seed: int = 1234) -> bytes:
    rng = random.Random(seed)
    parts: list[str] = []
    total = 0
    while total < size:
        s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}{rng.choice(_ENDINGS)}\n"
        parts.append(s)
        total += len(s)
    return "".join(parts).encode()[:size]
