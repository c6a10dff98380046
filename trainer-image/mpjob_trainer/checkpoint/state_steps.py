"""The optimizer steps torch's state-dict functions make, which are not training steps.

torch's `get_state_dict` and `set_state_dict` (DCP's, for a sharded model) step an optimizer that
holds no state yet on zero gradients at lr 0, to make its state; an optimizer that never holds
any (SGD without momentum) is stepped so at every save. The session hooks each optimizer's step
(session.steps: the applied-step count, and in fp16 the check that the loop steps only through
run.step()): a step inside `state_dict_steps()` is none of the loop's, and they leave it alone. In
fp16 that check took DCP's step at the first save for the script's own and ended the attempt a
ConfigError. A context variable: the calls run on the training thread, and a staging thread's
copies step nothing.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

_INSIDE = contextvars.ContextVar("mpjob_state_dict_steps", default=False)


@contextmanager
def state_dict_steps() -> Iterator[None]:
    """The block calls torch's state-dict functions: an optimizer step in it is theirs."""
    token = _INSIDE.set(True)
    try:
        yield
    finally:
        _INSIDE.reset(token)


def stepped_for_state() -> bool:
    """Whether an optimizer step now is one a state-dict function makes (`state_dict_steps`)."""
    return _INSIDE.get()
