"""A misspelt name and the allowed names closest to it: what a misspelt manifest field, a
misspelt builtin argument and a misspelt `mpjob` command are told."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

#: How alike a name must be to be suggested (difflib's ratio, 0..1).
CLOSE = 0.6
#: Other names are suggested beside the closest only when nearly as close.
NEAR_BEST = 0.05


def did_you_mean(word: str, words: Iterable[str]) -> str:
    """'did you mean batchSize?' naming the `closest` of `words` to a mistyped `word` ('' when none
    is close)."""
    close = closest(word, list(words))
    return f"did you mean {' or '.join(close)}?" if close else ""


def closest(word: str, words: list[str]) -> list[str]:
    """The `words` nearly as close to `word` as the closest one (at most three), none when none is
    close; compared without case, `_` and `-` (batch_size and BatchSize are batchSize's)."""
    ratios = {w: difflib.SequenceMatcher(None, key(word), key(w)).ratio() for w in words}
    best = max(ratios.values(), default=0.0)
    near = [w for w, r in ratios.items() if r >= max(CLOSE, best - NEAR_BEST)]
    return sorted(near, key=lambda w: -ratios[w])[:3]


def key(name: str) -> str:
    """A name as names are compared: without case, `_` and `-`."""
    return name.replace("_", "").replace("-", "").lower()
