"""The keys of a captured training state that are not the training's own (TrainingState.capture
writes some, the checkpoint reader sets others), and the rule a state read from a file keeps:
none of the reader's keys, and a rank file's sharded objects named as a capture names them, each
a registered object of its kind."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

#: In a captured state: the state dicts DCP writes, by the names the objects were registered under.
SHARDS = "shards"
#: In a captured state: which registered names are in the shards ({"module": ..., "optimizer": ...}).
SHARDED_OBJECTS = "shardedObjects"
#: In a state read from a sharded checkpoint: its files as this rank checked them (CheckedShards:
#: what the restore reads; never written).
LISTED = "shardFiles"
#: In a capture: held in memory, every object by its own state_dict() (never written).
IN_MEMORY = "heldInMemory"
#: What a capture holds that only a reader sets (SHARDS: the folder it read; LISTED) or that is
#: never written (IN_MEMORY): a state read from a file that holds one, mpjob did not write.
READERS_KEYS = (SHARDS, LISTED, IN_MEMORY)


def foreign_keys_problem(state: dict[str, Any], *, sharded: bool) -> str | None:
    """What of the keys no checkpoint writes there a state read from a file holds (None: none):
    READERS_KEYS anywhere, SHARDED_OBJECTS in a single file (they would point the restore at any
    folder's shards); a rank file's SHARDED_OBJECTS, where it has one, must name its sharded
    objects as `shard_names` does ({"module": name, "optimizer": name}, the optimizer optional)."""
    for key in (*READERS_KEYS, *(() if sharded else (SHARDED_OBJECTS,))):
        if key in state:
            return f"holds {key!r}, which no checkpoint of this layout writes"
    names = state.get(SHARDED_OBJECTS, {"module": ""})  # none: the restore's to refuse (TrainingState)
    named = isinstance(names, dict) and "module" in names and set(names) <= {"module", "optimizer"}
    if sharded and not (named and all(isinstance(name, str) for name in names.values())):
        return f"holds {SHARDED_OBJECTS} {names!r:.60}, not the names of its sharded objects"
    return None


def kinds_problem(names: dict[str, str], objects: dict[str, Any]) -> str | None:
    """What of a checkpoint's `names` ({"module": name, "optimizer": name}) names one of `objects`
    as the other kind (None: nothing): a capture names them as checkpoint.shards.shard_names does, so a name
    this run registered as another kind is the checkpoint's fault. A name it did not register is
    the run's setup (checkpoint.shards.restore_shards)."""
    kinds = {"module": nn.Module, "optimizer": torch.optim.Optimizer}
    for kind, name in names.items():
        obj = objects.get(name)
        if obj is not None and not isinstance(obj, kinds[kind]):
            return f"names {name!r} as its sharded {kind}, and this run's {name!r} is a {type(obj).__name__} object"
    return None
