"""CheckpointStore: exact-resume checkpoints that are never overwritten in place.

Layout under the checkpoint directory:
    step-000000200/state.pt        torch.save of the whole training state (weights_only-safe)
    step-000000200/manifest.json   step, precision, config digest, sha256 and size of state.pt
A framework adapter's checkpoint (Hugging Face Trainer, Lightning) adds what the framework
wrote under `framework/`; the manifest then lists the sha256 of every file, and loading checks
them all. A checkpoint is written into `.tmp-<step>-<pid>/`, each file fsynced, the directory fsynced,
then renamed into place: a process killed at any moment leaves either a complete checkpoint
or a temp directory that loading ignores. The newest `keep` are kept; older ones are pruned
only after the new one is durable. Loading verifies the manifest, the sha256 and the config
digest and falls back to the previous good checkpoint when the newest is bad.

The directory is one job's own (`AttemptLaunch.checkpointDir`), and every manifest names the job
that wrote it (`job`, `AttemptLaunch.job_identity`). A store prunes, and moves aside when corrupt,
only checkpoints whose manifest names its own job: anything else found there (copied in by hand,
written by another job, a manifest that cannot be read) is never renamed or deleted, and a save
that finds such a folder at its own step writes nothing (`CheckpointTaken`).

What is written is a private host copy of the training state: `StagingBuffers` fills
reusable (pinned, for CUDA) buffers without waiting for the device, and `save_async` writes
and hashes it in a background thread once the copies have landed.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mpjob_contract.report import CheckpointRef

STATE = "state.pt"
MANIFEST = "manifest.json"
#: Where an adopted framework checkpoint lies inside an mpjob checkpoint directory.
FRAMEWORK = "framework"
_NAME = re.compile(r"^step-(\d{9})$")


class CorruptCheckpoint(Exception):
    pass


class CheckpointTaken(Exception):
    """The folder of the step to save holds a checkpoint this store's job did not write."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _hash_tree(root: Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file under `root` but the manifest, each fsynced on the way
    (a framework's own writes are not known to be durable)."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST):
        with path.open("rb") as f:
            os.fsync(f.fileno())
        files[path.relative_to(root).as_posix()] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    for folder in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
        _fsync_dir(folder)
    return files


def _manifest_precision(path: Path) -> str | None:
    """The precision a checkpoint's manifest names (None when unreadable: verify() says why)."""
    try:
        return str(json.loads((path / MANIFEST).read_text())["precision"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class SaveResult:
    ref: CheckpointRef
    seconds: float
    bytes: int


class CheckpointStore:
    def __init__(self, root: Path, keep: int, config_digest: str, log: Any = None, *, job: str = "") -> None:
        self.root = root
        self.keep = keep
        self.config_digest = config_digest
        self.job = job  # written into every manifest: what this store may prune or move aside
        self.log = log or (lambda *a, **k: None)
        self.root.mkdir(parents=True, exist_ok=True)
        self._thread: threading.Thread | None = None
        self.pending_step = 0  # the step of the newest asynchronous save
        self._result: SaveResult | None = None
        self._error: BaseException | None = None
        self.last_good: CheckpointRef | None = None

    # -- listing and loading -------------------------------------------------------------
    def steps(self) -> list[tuple[int, Path]]:
        found = []
        for child in self.root.iterdir():
            m = _NAME.match(child.name)
            if m and child.is_dir():
                found.append((int(m.group(1)), child))
        return sorted(found)

    def wrote(self, path: Path) -> bool:
        """Whether this store's job wrote the checkpoint at `path` (its manifest names the job)."""
        try:
            return bool(json.loads((path / MANIFEST).read_text()).get("job") == self.job)
        except (OSError, ValueError, AttributeError):
            return False

    def verify(self, path: Path) -> tuple[CheckpointRef, dict[str, Any]]:
        """Check manifest, sha256 and config digest; return the ref and the loaded state."""
        manifest_path = path / MANIFEST
        if not manifest_path.is_file():
            raise CorruptCheckpoint(f"{path.name}: manifest missing")
        try:
            manifest = json.loads(manifest_path.read_text())
            expected_sha = manifest["files"][STATE]["sha256"]
            step = int(manifest["step"])
            precision = str(manifest["precision"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptCheckpoint(f"{path.name}: unreadable manifest ({exc!r})") from exc
        if manifest.get("configDigest") != self.config_digest:
            raise CorruptCheckpoint(
                f"{path.name}: config digest {manifest.get('configDigest')!r} does not match this "
                f"job's {self.config_digest!r} (task or training settings changed)"
            )
        for name, meta in manifest["files"].items():  # state.pt and, when adopted, the framework's files
            if not (path / name).is_file():
                raise CorruptCheckpoint(f"{path.name}: {name} missing")
            actual, expected = sha256_file(path / name), str(meta.get("sha256"))
            if actual != expected:
                raise CorruptCheckpoint(f"{path.name}: {name} sha256 mismatch ({actual[:12]} != {expected[:12]})")
        state_path = path / STATE
        try:
            state = torch.load(state_path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise CorruptCheckpoint(f"{path.name}: cannot load ({exc!r})") from exc
        if int(state.get("step", -1)) != step:
            raise CorruptCheckpoint(f"{path.name}: state step {state.get('step')} != manifest step {step}")
        return CheckpointRef(step=step, path=str(path), sha256=expected_sha, precision=precision), state

    def load(
        self, prefer: str | None = None, *, newer_in: str | None = None
    ) -> tuple[CheckpointRef, dict[str, Any]] | None:
        """The named checkpoint if valid, else the newest valid one, else None. With `newer_in`,
        a valid checkpoint of that precision newer than the named one comes first: the attempt
        that was told to resume from `prefer` wrote it itself before it was stopped (a queue
        preempted it, a restarted operator recreated its Job) and restarts with the same launch;
        no earlier attempt in that precision can have gone past the checkpoint it was given."""
        newest_first = [(step, path) for step, path in reversed(self.steps())]
        candidates = [path for _, path in newest_first]
        if prefer:
            preferred = Path(prefer)
            rest = [path for path in candidates if path.resolve() != preferred.resolve()]
            named = _NAME.match(preferred.name)
            floor = int(named.group(1)) if named else None
            ahead = [
                path
                for step, path in newest_first
                if newer_in and floor is not None and step > floor and _manifest_precision(path) == newer_in
            ]
            candidates = ahead + [preferred] + [path for path in rest if path not in ahead]
        for path in candidates:
            try:
                ref, state = self.verify(path)
            except CorruptCheckpoint as exc:
                self.log("checkpointRejected", path=str(path), problem=str(exc))
                continue
            self.last_good = ref
            return ref, state
        return None

    # -- saving --------------------------------------------------------------------------
    def staging(self, name: str) -> Path:
        """An empty folder `.tmp-*` on the store's filesystem for a framework to write its
        checkpoint into before `save(..., adopt=...)` moves it in (leftovers: clean_stale)."""
        assert name.startswith(".tmp-"), name
        folder = self.root / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return folder

    def _write(self, step: int, precision: str, state: dict[str, Any], adopt: Path | None = None) -> SaveResult:
        tmp = self.root / f".tmp-{step:09d}-{os.getpid()}"
        try:
            return self._write_via(tmp, step, precision, state, adopt)
        except Exception:
            shutil.rmtree(tmp, ignore_errors=True)  # a failed write leaves nothing behind
            raise

    def _write_via(self, tmp: Path, step: int, precision: str, state: dict[str, Any], adopt: Path | None) -> SaveResult:
        start = time.perf_counter()
        final = self.root / f"step-{step:09d}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        if adopt is not None:
            adopt.rename(tmp / FRAMEWORK)  # the framework has finished writing: now it is ours
        with (tmp / STATE).open("wb") as f:
            torch.save(state, f)
        files = _hash_tree(tmp)
        digest = files[STATE]["sha256"]
        size = sum(meta["bytes"] for meta in files.values())
        manifest = {
            "step": step,
            "precision": precision,
            "configDigest": self.config_digest,
            "job": self.job,
            "files": files,
            "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        with (tmp / MANIFEST).open("w") as f:
            json.dump(manifest, f)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        kept = self._occupied(final) if final.exists() else None
        if kept is not None:  # same step already durable: keep it, never overwrite in place
            shutil.rmtree(tmp)
            return SaveResult(kept, time.perf_counter() - start, size)
        tmp.rename(final)
        _fsync_dir(self.root)
        self._prune()
        ref = CheckpointRef(step=step, path=str(final), sha256=digest, precision=precision)
        return SaveResult(ref, time.perf_counter() - start, size)

    def _occupied(self, final: Path) -> CheckpointRef | None:
        """A checkpoint already at the step to save: ours and valid is kept (its ref); ours and
        corrupt is moved aside (None: the new one takes its place); another's stays untouched
        and this save writes nothing (CheckpointTaken)."""
        if not self.wrote(final):
            raise CheckpointTaken(f"{final} holds a checkpoint this job did not write: left as it is, not replaced")
        try:
            ref, _ = self.verify(final)
        except CorruptCheckpoint:
            final.rename(self.root / f".corrupt-{final.name}-{os.getpid()}")
            return None
        return ref

    def _prune(self) -> None:
        """Keep this job's newest `keep`; what it did not write neither counts nor goes."""
        ours = [path for _, path in self.steps() if self.wrote(path)]
        for path in ours[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)

    def clean_stale(self) -> None:
        """Remove temp directories left by processes that were killed mid-save."""
        for child in self.root.glob(".tmp-*"):
            shutil.rmtree(child, ignore_errors=True)

    def save(self, step: int, precision: str, state: dict[str, Any], *, adopt: Path | None = None) -> SaveResult:
        """Write a checkpoint now; `adopt`: the folder of a framework's finished checkpoint (on this
        filesystem), moved in as `framework/` and covered by the manifest."""
        self.wait()
        result = self._write(step, precision, state, adopt)
        self.last_good = result.ref
        return result

    def save_async(
        self, step: int, precision: str, state: dict[str, Any], *, ready: Callable[[], None] | None = None
    ) -> None:
        """Write in a background thread; `state` must already be a private CPU copy, complete
        once `ready()` returns (the thread calls it first: staged device copies land)."""
        self.wait()
        self.pending_step = step

        def work() -> None:
            try:
                if ready is not None:
                    ready()
                self._result = self._write(step, precision, state)
            except BaseException as exc:  # reported by wait()
                self._error = exc

        self._thread = threading.Thread(target=work, name=f"checkpoint-{step}", daemon=True)
        self._thread.start()

    def wait(self) -> SaveResult | None:
        """Join an in-flight asynchronous save; returns its result (once)."""
        if self._thread is None:
            return None
        self._thread.join()
        self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        result, self._result = self._result, None
        if result is not None:
            self.last_good = result.ref
        return result

    def poll(self) -> SaveResult | None:
        """The result of a finished asynchronous save, without blocking."""
        if self._thread is not None and not self._thread.is_alive():
            return self.wait()
        return None

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def snapshot(obj: Any) -> Any:
    """A private CPU copy of a (nested) state dict, made now (blocking; fresh tensors each call).
    For a synchronous write; the periodic checkpoints stage into reusable buffers instead."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: snapshot(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [snapshot(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(snapshot(v) for v in obj)
    return copy.deepcopy(obj)


@dataclass
class Staged:
    """A state dict staged in host memory. Its tensors may still be filling from CUDA:
    `ready()` blocks until they have (one event per device), and must return before reading."""

    state: dict[str, Any]
    events: list[torch.cuda.Event] = field(default_factory=list)

    def ready(self) -> None:
        for event in self.events:
            event.synchronize()


class StagingBuffers:
    """Reusable host copies of a state dict's tensors, so that a checkpoint costs the training
    thread no more than issuing the copies.

    Each tensor has one buffer, keyed by its place in the state dict (("optimizer", "state", 3,
    "exp_avg")), allocated at the first save and refilled by every later one; a tensor whose
    shape, dtype or device kind changed gets a new buffer, and a place no longer in the state
    drops its own. Buffers of CUDA tensors are pinned, so `copy_(src, non_blocking=True)` is a
    true asynchronous device-to-host copy: nothing waits for it on the host. Pinned memory is
    page-locked for the life of the run (one copy of the state, like the snapshot it replaces,
    but kept); CPU tensors get ordinary memory and their copy is synchronous anyway.

    Why the copies read the values of this step although training goes on at once: a copy is
    enqueued on the current stream of its tensor's device, behind every kernel of the steps
    already launched and ahead of every kernel launched later (the next optimizer update
    included), and a stream runs its work in order. So the copy sees the weights as they are
    when `stage` is called, not as they will be. An event recorded on each device's current
    stream after the copies marks their end; `Staged.ready()` waits for those events in the
    writer thread, never on the training thread. (A temporary source tensor freed right
    after staging is safe too: the caching allocator reuses its memory only for work queued
    later on the same stream.) Code that updates weights on another stream must order that
    stream after the current one, which PyTorch requires of it anyway.

    A buffer may be refilled only when the write that read it has finished: the caller waits
    for the previous save before staging the next (Checkpointer does). Values that are not
    tensors are deep-copied, so training mutating them later cannot change what is written.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], tuple[torch.Tensor, bool]] = {}
        self._used: set[tuple[Any, ...]] = set()
        self._devices: set[torch.device] = set()

    def stage(self, state: dict[str, Any]) -> Staged:
        """Copy `state` into the buffers (device copies issued, not awaited)."""
        self._used, self._devices = set(), set()
        staged = self._copy(state, ())
        for stale in self._buffers.keys() - self._used:
            del self._buffers[stale]
        events = [_copies_done(device) for device in sorted(self._devices, key=str)]
        return Staged(staged, events)

    def buffer(self, place: tuple[Any, ...]) -> torch.Tensor | None:
        """The buffer of the tensor at `place` (None when there is none)."""
        held = self._buffers.get(place)
        return held[0] if held is not None else None

    def _copy(self, obj: Any, place: tuple[Any, ...]) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj.detach(), place)
        if isinstance(obj, dict):
            return {k: self._copy(v, (*place, k)) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self._copy(v, (*place, i)) for i, v in enumerate(obj)]
        if isinstance(obj, tuple):
            return tuple(self._copy(v, (*place, i)) for i, v in enumerate(obj))
        return copy.deepcopy(obj)

    def _tensor(self, tensor: torch.Tensor, place: tuple[Any, ...]) -> torch.Tensor:
        if tensor.layout != torch.strided or tensor.device.type not in ("cpu", "cuda"):
            return tensor.to("cpu", copy=True)  # sparse, or another backend: a plain blocking copy
        pinned = tensor.device.type == "cuda"
        held = self._buffers.get(place)
        if held is None or held[1] != pinned or held[0].shape != tensor.shape or held[0].dtype != tensor.dtype:
            held = (torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pinned), pinned)
            self._buffers[place] = held
        held[0].copy_(tensor, non_blocking=True)
        self._used.add(place)
        if pinned:
            self._devices.add(tensor.device)
        return held[0]


def _copies_done(device: torch.device) -> torch.cuda.Event:
    """An event on `device`'s current stream, behind the copies just issued there."""
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event
