"""The kubelet's expansion of `$(NAME)` in a container's env values: `$$` is a `$`, `$(NAME)` the
value of NAME when an entry before it (or a Service's variable) defines it, else left as written.

What the operator writes into an env value is data (the attempt's launch holds the user's spec,
whose strings may hold `$$` or `$(...)`), so it is escaped to arrive as written (`literal`); the
manifest's own env entries are the user's, expanded as a cluster expands them, and `mpjob run`
expands them the same way (`expanded`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_REFERENCE = re.compile(r"\$\$|\$\(([^)]*)\)")


def literal(text: str) -> str:
    """`text` as an env value the kubelet hands over unchanged: every `$` doubled."""
    return text.replace("$", "$$")


def expanded(text: str, defined: Mapping[str, str]) -> str:
    """`text` as the kubelet expands an env value, with `defined` the variables before it."""

    def one(reference: re.Match[str]) -> str:
        if reference.group(0) == "$$":
            return "$"
        return defined.get(reference.group(1), reference.group(0))

    return _REFERENCE.sub(one, text)
