"""Sharded checkpoints: every rank writes its own shards, rank 0 commits them last.

A run whose model is sharded (its parameters are DTensors, as FSDP2's `fully_shard` leaves
them) checkpoints with torch.distributed.checkpoint (DCP): each rank writes the shards it
holds of the model and optimizer state (`__<rank>_0.distcp`; rank 0 also DCP's `.metadata`,
the global index that lets any world size read them back) and its own small state
(`rank-<r>.pt`: its generators, the step, the scaler, the other stateful objects). Nothing
is gathered onto one rank.

Writing, per rank (`ShardedWriter.start`, then `PendingSave.finish`):
1. on the training thread only the capture (get_state_dict's answer, references to this
   rank's shards, renamed from the plain state dicts after the first save: checkpoint.live),
   a copy of the small state, and a device copy of the tensors that are no shards (buffers,
   which a forward pass changes in place: a BatchNorm's running statistics); then, on the
   writer thread, a DefaultStager copies the shards to host memory in its own thread. The
   training thread waits for that copy only before the next optimizer
   update (`PendingSave.staged`), the first moment the shards could change: forward and
   backward overlap the copy.
   (StagingBuffers would copy on the training thread: at N processes each rank's copy is 1/N
   of a rank-0 snapshot, which does not make the stall small; DCP's stager also knows
   DTensors.)
2. off the training thread: once every rank has its copy (agreed: a copy that failed on one
   rank fails the save on all, none left waiting in DCP's collectives), DCP plans and writes
   on a process group of its own (gloo), never the training's (collectives from two threads on
   one group could interleave); then each rank
   writes and hashes its files and every rank's outcome is gathered: the agreement that all
   ranks wrote. Only then rank 0 commits the checkpoint through CheckpointStore.commit (the
   manifest with every file's sha256, written last, then the atomic rename and keep-K
   pruning: the single-file rules, in one place) and tells every rank how it ended.
A rank killed at any moment leaves a `.tmp-*` folder without a manifest: never a checkpoint.

Reading (`read_local`, `restore_shards`): the ranks split the sha256 checks of the files, and
of the non-tensor values in them, between them (manifest.share_of), read DCP's index without
running code (checkpoint.dcp_reader) and agree on the
verdict, so that all of them take the same checkpoint; each loads the rank file of its own rank
(rank r of M reads rank r mod N of the N that wrote it: the generators are exact only on the
same world size) from the bytes it hashed against the manifest itself (on more ranks than wrote
it, that file is in another rank's share), then DCP reads the shards it needs now, whatever the
world size that wrote them (resharding), into the objects as they are sharded now, through a
reader of checked bytes only and a planner that reads non-tensor values weights-only. Every
byte DCP loads is one hashed against the manifest, each file read once per rank: the files a
rank checked are held, as checked, until its restore reads them (checkpoint.shard_copies).
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from mpjob_trainer.checkpoint.capture_keys import LISTED as LISTED  # the capture's keys, read here too
from mpjob_trainer.checkpoint.capture_keys import SHARDED_OBJECTS as SHARDED_OBJECTS
from mpjob_trainer.checkpoint.capture_keys import SHARDS as SHARDS
from mpjob_trainer.checkpoint.capture_keys import foreign_keys_problem
from mpjob_trainer.checkpoint.dcp_files import INDEX, index_size_problem
from mpjob_trainer.checkpoint.live import LiveStateDicts
from mpjob_trainer.checkpoint.manifest import (
    CorruptCheckpoint,
    Manifest,
    PartlyLoaded,
    read_manifest,
    share_of,
    state_problem,
)
from mpjob_trainer.checkpoint.peers import Peers, agree
from mpjob_trainer.checkpoint.state_steps import state_dict_steps
from mpjob_trainer.distributed import is_dtensor
from mpjob_trainer.errors import ConfigError

if TYPE_CHECKING:
    from mpjob_trainer.checkpoint.checked import CheckedSource
    from mpjob_trainer.checkpoint.shard_copies import CheckedShards

# DCP (and the DTensor it brings) is imported where a sharded checkpoint is read or written:
# a run that never shards never loads it, about a second off each trainer start.

#: What names a rank file, well formed or not (rank_file writes them).
_RANK_FILE = re.compile(r"rank-[0-9]+\.pt")


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def is_sharded(obj: Any) -> bool:
    """A module or optimizer whose parameters are DTensors (what fully_shard leaves)."""
    if isinstance(obj, nn.Module):
        return any(is_dtensor(p) for p in obj.parameters())
    if isinstance(obj, torch.optim.Optimizer):
        return any(is_dtensor(p) for group in obj.param_groups for p in group["params"])
    return False


# ---------------------------------------------------------------- the state dicts DCP sees
def shard_names(objects: dict[str, Any]) -> dict[str, str]:
    """{"module": name, "optimizer": name} of the sharded pair among `objects` (no optimizer
    when none is sharded); a ConfigError when they are more than one model and one optimizer."""
    modules = [name for name, obj in objects.items() if isinstance(obj, nn.Module) and is_sharded(obj)]
    optimizers = [name for name, obj in objects.items() if isinstance(obj, torch.optim.Optimizer) and is_sharded(obj)]
    if len(modules) != 1 or len(optimizers) > 1:
        raise ConfigError(
            f"resume(): a sharded checkpoint holds one sharded model and at most one optimizer of it; "
            f"this run registered sharded modules {modules} and optimizers {optimizers}"
        )
    return {"module": modules[0], **({"optimizer": optimizers[0]} if optimizers else {})}


def state_dicts(objects: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """The live DCP state dicts of the pair `names` (DTensors: each rank's own shards)."""
    model: nn.Module = objects[names["module"]]
    optimizers = [objects[names["optimizer"]]] if "optimizer" in names else []
    from torch.distributed.checkpoint.state_dict import get_state_dict

    with state_dict_steps():  # it steps an optimizer that holds no state yet
        model_sd, optim_sd = get_state_dict(model, optimizers)
    return _by_name(names, model_sd, optim_sd)


class ShardDicts:
    """`state_dicts(objects, names)` for a run's every save, cheaply (checkpoint.live)."""

    def __init__(self, objects: dict[str, Any], names: dict[str, str]) -> None:
        self.names = names
        optimizer = objects[names["optimizer"]] if "optimizer" in names else None
        self.live = LiveStateDicts(objects[names["module"]], optimizer)

    def __call__(self) -> dict[str, Any]:
        return _by_name(self.names, *self.live())


def _by_name(names: dict[str, str], model_sd: dict[str, Any], optim_sd: dict[str, Any]) -> dict[str, Any]:
    return {names["module"]: model_sd, **({names["optimizer"]: optim_sd} if "optimizer" in names else {})}


def restore_shards(
    folder: Path, objects: dict[str, Any], names: dict[str, str], checked: CheckedShards | None = None
) -> None:
    """Read the shards in `folder` into the objects `names` picks, as they are sharded now, from
    bytes checked against its manifest: those `checked` (a state's LISTED: its verification's)
    holds or checks, else checked against the manifest there now. Its copies go once read."""
    missing = [name for name in names.values() if name not in objects]
    if missing:
        held = ", ".join(missing)
        raise ConfigError(f"the sharded checkpoint {folder.name} holds {held}, which resume() did not name")
    import torch.distributed.checkpoint as dcp

    from mpjob_trainer.checkpoint.checked import VolumeFiles
    from mpjob_trainer.checkpoint.dcp_fit import checked_before_load
    from mpjob_trainer.checkpoint.dcp_reader import CheckedReader, WeightsOnlyPlanner
    from mpjob_trainer.checkpoint.shard_copies import CheckedShards

    target = state_dicts(objects, names)
    groups = [dict(group) for group in target[names["optimizer"]]["param_groups"]] if "optimizer" in names else []
    shards = checked if checked is not None else CheckedShards(VolumeFiles(folder), read_manifest(folder).files)
    try:
        optimizer = objects[names["optimizer"]] if "optimizer" in names else None
        checked_before_load(shards, target, names, objects[names["module"]], optimizer)  # every rank's, agreed
        dcp.load(
            target,
            storage_reader=CheckedReader(shards),
            planner=WeightsOnlyPlanner(names["module"]),
            no_dist=not (dist.is_available() and dist.is_initialized()),
        )
    except dcp.CheckpointException as exc:  # a BaseException: what DCP makes of any failure while reading
        raise _not_read(folder, names, exc) from None
    finally:
        shards.close()
    _set(folder, objects, names, target, groups)


def _set(
    folder: Path, objects: dict[str, Any], names: dict[str, str], target: dict[str, Any], groups: list[dict[str, Any]]
) -> None:
    """Hand the state dicts DCP read (`target`) to the objects (torch's set_state_dict), the
    optimizer's groups with the implementation flags of this run's (`groups`, as they were before
    DCP read: checkpoint.optimizer_settings.RUN_FLAGS). What the run's setup alone makes fail, and
    what the index says, were checked before DCP read anything (checkpoint.dcp_fit): what still
    fails here is the shards' fault, read into the objects in part already (PartlyLoaded: every
    rank passes the checkpoint over, checkpoint.resume)."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    from mpjob_trainer.checkpoint.optimizer_settings import kept_run_flags_by_name

    model: nn.Module = objects[names["module"]]
    optimizers = [objects[names["optimizer"]]] if "optimizer" in names else []
    optim_sd = target[names["optimizer"]] if optimizers else {}
    if optimizers:
        optim_sd = {**optim_sd, "param_groups": kept_run_flags_by_name(optim_sd["param_groups"], groups)}
    try:
        with state_dict_steps():  # it steps an optimizer that holds no state yet
            set_state_dict(model, optimizers, model_state_dict=target[names["module"]], optim_state_dict=optim_sd)
    except Exception as exc:
        why = f"{type(exc).__name__}: {str(exc)[:300]}"
        raise PartlyLoaded(f"{folder.name}: its shards, read, do not load into this run's objects ({why})") from None


def _not_read(folder: Path, names: dict[str, str], exc: Any) -> Exception:
    """Why DCP did not read the shards, from a CheckpointException's per-rank (exception, traceback)
    pairs (every rank sees every rank's): objects that do not fit them (ShardsDoNotFit) are a
    ConfigError, as a single-file state that does not load; anything else makes them corrupt, and
    what DCP had read before it failed may be in the objects already (PartlyLoaded)."""
    from mpjob_trainer.checkpoint.dcp_reader import ShardsDoNotFit

    failures = [(rank, f[0] if isinstance(f, tuple) else f) for rank, f in sorted(exc.failures.items())]
    misfit = next((f"rank {rank}: {cause}" for rank, cause in failures if isinstance(cause, ShardsDoNotFit)), None)
    if misfit is not None:
        return ConfigError(
            f"cannot load the sharded checkpoint {folder.name} into this run's {', '.join(names.values())} "
            f"({misfit}): the script no longer matches the run that wrote it"
        )
    rank, cause = failures[0] if failures else (0, exc)
    return PartlyLoaded(f"{folder.name}: DCP cannot read its shards (rank {rank}: {str(cause)[:300]})")


def listing_problem(manifest: Manifest) -> str | None:
    """What a sharded checkpoint's manifest fails to list (None: nothing): DCP's index, of a size a
    restore reads (dcp_files.MAX_INDEX_BYTES), and the rank file of each of its worldSize ranks, and
    no other rank file. A rank reads the index and a rank file whether listed or not: unlisted,
    they would be read unchecked."""
    if INDEX not in manifest.files:
        return f"does not list DCP's index {INDEX}"
    too_big = index_size_problem(int(manifest.files[INDEX]["bytes"]))
    if too_big is not None:
        return f"lists {too_big}"
    listed = {name for name in manifest.files if _RANK_FILE.fullmatch(name)}
    # The first rank file missing, looked for no further than one past those listed: a planted
    # worldSize of millions costs no more than a true one.
    ranks = range(manifest.world_size)
    missing = next((name for rank in ranks if (name := rank_file(rank)) not in listed), None)
    if missing is not None:
        return f"does not list {missing}, the rank file of one of its {manifest.world_size} ranks"
    extra = sorted(listed - {rank_file(rank) for rank in ranks})  # every rank's is listed: no more names
    if extra:
        return f"lists {extra[0][:100]}, not a rank file of its {manifest.world_size} ranks"
    return None


def read_local(
    folder: Path, manifest: Manifest, peers: Peers, *, hold: bool = True, files: CheckedSource | None = None
) -> dict[str, Any]:
    """Check the files (each rank its share), agree, and return this rank's small state; under
    LISTED the files as this rank checked them (CheckedShards), which the restore reads, unless
    not `hold` (a verification that loads nothing: their copies go at once). `files`: where they
    are read from (a bucket's: checkpoint.bucket_files), else `folder` on a volume. A read that
    fails without a verdict on the checkpoint (a bucket's error) fails on every rank (peers.agree)."""
    from mpjob_trainer.checkpoint.checked import VolumeFiles
    from mpjob_trainer.checkpoint.shard_copies import CheckedShards

    state: dict[str, Any] = {}
    problem, failure, shards, checked = None, None, None, {}
    try:
        unlisted = listing_problem(manifest)
        if unlisted is not None:
            raise CorruptCheckpoint(f"{folder.name}: its manifest {unlisted}")
        shards = CheckedShards(files or VolumeFiles(folder), manifest.files)  # DCP's index, read without running code
        # each rank its share of the files, and of the values in them, nothing unpickled unrestricted
        share = share_of(manifest.files, peers.rank, peers.size)
        checked = shards.check_share(share, resharded=peers.size != manifest.world_size)
        # the bytes this rank hashed itself: on more ranks than wrote it, its rank file is in another's share
        own = rank_file(peers.rank % manifest.world_size)
        raw = shards.contents(own)
        shards.drop(own)
        state, problem = _rank_state(folder, own, raw, manifest.step)
    except CorruptCheckpoint as exc:
        problem = str(exc)
    except Exception as exc:
        failure = exc
    values = peers.gather(checked)  # what a ranged read of a value in another rank's share must match
    try:
        agree(problem, peers, failure)
    except BaseException:
        if shards is not None:
            shards.close()
        raise
    assert shards is not None  # no rank found a problem, this one included
    if not hold:
        shards.close()
    else:
        shards.values = {span: digest for digests in values for span, digest in digests.items()}
        state[LISTED] = shards
    return state


def _rank_state(folder: Path, name: str, raw: bytes, step: int) -> tuple[dict[str, Any], str | None]:
    """The rank file `name` loaded from its checked bytes `raw`, and what makes it no state of `step`."""
    try:
        state = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:
        return {}, f"{folder.name}: cannot load {name} ({exc!r})"
    unfit = state_problem(state, step) or foreign_keys_problem(state, sharded=True)
    return (state, None) if unfit is None else ({}, f"{folder.name}: {name} {unfit}")
