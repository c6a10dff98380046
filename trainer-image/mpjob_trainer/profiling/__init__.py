"""Profiles on demand: rank 0 captures a torch.profiler trace of the next N steps when the
operator asks (`POST /profile?id=ID&steps=N` on the metrics port, see `control`), once per id.

The training thread pays one attribute read per step while nothing is asked. A capture starts
at the next step boundary, runs `steps` optimizer steps, and stops; exporting, measuring the
kernel time by precision (`kernels`) and compressing the trace run on a thread of their own.
The trace lands in the job's checkpoint folder (`profiles/p<ID>/trace.json.gz`, written to a
temporary name and renamed; uploaded there when the job's checkpoints are in a bucket:
`places`), bounded: the profiler's trace is read no further than
MAX_RAW_TRACE_BYTES (a larger one fails unparsed), a compressed trace over MAX_TRACE_BYTES is
not kept and the profile says so, and an attempt keeps its newest KEPT_TRACES traces (older
ones are pruned). One capture is in flight at a time, from its request until its trace is
written: a new id asked meanwhile is refused (`ask` returns None; the control route's 409).
Answers for the last few ids are kept, so a request asked again (the operator asks on every
tick until it sees a final state) is answered, never repeated.
"""

from __future__ import annotations

import gzip
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from mpjob_contract.tracking import (
    KEPT_TRACES,
    MAX_PROFILE_STEPS,
    MAX_RAW_TRACE_BYTES,
    MAX_TRACE_BYTES,
    SUMMARY_FILE,
    TRACE_FILE,
    ProfileAnswer,
)
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.profiling.kernels import kernel_time
from mpjob_trainer.profiling.places import FolderProfiles, ProfilePlace

#: Answers kept for ids asked before (the operator asks until it sees a final state).
KEPT_ANSWERS = 16
#: How long the end of an attempt waits for a capture it cut short to be written.
CLOSE_SECONDS = 30.0


class ProfileCapture:
    """Rank 0's profiles: one at a time, each id once."""

    def __init__(
        self, place: str | ProfilePlace, *, device: torch.device, log: EventLog, metrics: TrainerMetrics
    ) -> None:
        """`place`: where profiles go (a checkpoint folder of the volume, or a ProfilePlace)."""
        self.place = FolderProfiles(place) if isinstance(place, str) else place
        self.device, self.log = device, log
        self.metrics = metrics  # its children are read at use: an `auto` attempt relabels them
        self._lock = threading.Lock()
        self._answers: dict[int, ProfileAnswer] = {}
        #: Asked and not started yet (id, steps); read by the training thread every step.
        self.pending: tuple[int, int] | None = None
        self._active: tuple[int, int, int, Any] | None = None  # id, steps, first step, profiler
        self._left = 0
        #: A finished capture still being written out (one in flight until then).
        self._writing = False
        #: The ids of this attempt's traces, oldest first (the newest KEPT_TRACES stay).
        self._kept: list[int] = []

    # ---------------------------------------------------------------- the control thread
    def ask(self, profile_id: int, steps: int) -> ProfileAnswer | None:
        """Profile `steps` steps under `profile_id` (once); what is known of that id now, or
        None while another capture is in flight (asked, capturing or being written)."""
        with self._lock:
            known = self._answers.get(profile_id)
            if known is not None:
                return known
            if not 1 <= steps <= MAX_PROFILE_STEPS:
                return self._answer(profile_id, "Failed", message=f"steps must be 1 to {MAX_PROFILE_STEPS}")
            if self.pending is not None or self._active is not None or self._writing:
                return None
            self.pending = (profile_id, steps)
            return self._answer(profile_id, "Requested", steps=steps)

    def _answer(self, profile_id: int, state: Any, **fields: Any) -> ProfileAnswer:
        answer = ProfileAnswer(id=profile_id, state=state, **fields)
        self._answers[profile_id] = answer
        while len(self._answers) > KEPT_ANSWERS:
            self._answers.pop(next(iter(self._answers)))
        return answer

    # ---------------------------------------------------------------- the training thread
    def step(self, step: int) -> None:
        """Optimizer step `step` (1-based) ended: start, advance or finish a capture."""
        if self._active is not None:
            self._active[3].step()
            self._left -= 1
            if self._left <= 0:
                self.finish(step)
        elif self.pending is not None:
            self._start(step)

    def _start(self, step: int) -> None:
        with self._lock:
            assert self.pending is not None
            profile_id, steps = self.pending
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        profiler = profile(activities=activities, record_shapes=True)
        profiler.start()
        with self._lock:  # in flight throughout: `ask` sees it pending, then active
            self.pending = None
            self._active, self._left = (profile_id, steps, step + 1, profiler), steps
            self._answer(profile_id, "Capturing", steps=steps, firstStep=step + 1)

    def finish(self, step: int) -> threading.Thread | None:
        """Stop a capture (its steps are done, or the attempt ends); a thread writes it out."""
        if self._active is None:
            return None
        profile_id, _, first, profiler = self._active
        with self._lock:
            self._active, self._writing = None, True
        profiler.stop()
        done = max(0, step - first + 1)
        args = (profile_id, done, first, profiler)
        writer = threading.Thread(target=self._write, args=args, name="mpjob-profile", daemon=True)
        writer.start()
        return writer

    def close(self, step: int) -> None:
        """The attempt ends: a capture still running keeps the steps it has, written out
        before the process goes (within CLOSE_SECONDS)."""
        writer = self.finish(step)
        if writer is not None:
            writer.join(timeout=CLOSE_SECONDS)

    # ---------------------------------------------------------------- the writer thread
    def _write(self, profile_id: int, steps: int, first: int, profiler: Any) -> None:
        folder = self.place.folder(profile_id)
        path = folder / TRACE_FILE
        try:
            folder.mkdir(parents=True, exist_ok=True)
            raw = folder / f".tmp-{os.getpid()}-trace.json"
            profiler.export_chrome_trace(str(raw))
            data = _bounded_read(raw)
            raw.unlink(missing_ok=True)
            share = kernel_time(json.loads(data)).low_share
            size = _compress(data, path)
            where = self.place.where(profile_id)
            fields: dict[str, Any] = {"steps": steps, "firstStep": first, "path": where, "traceBytes": size}
            answer = ProfileAnswer(id=profile_id, state="Captured", lowPrecisionKernelShare=share, **fields)
            (folder / SUMMARY_FILE).write_text(answer.to_wire())
            self.place.publish(profile_id)
            self._prune(profile_id)
            if share is not None:
                self.metrics.low_precision_share.set(share)
            said: dict[str, Any] = {"path": where, "traceBytes": size, "lowPrecisionKernelShare": share}
            self.log("profile", id=profile_id, step=first, steps=steps, **said)
        except Exception as exc:
            for leftover in folder.glob(".tmp-*"):
                leftover.unlink(missing_ok=True)
            why = f"{type(exc).__name__}: {exc}"[:512]
            answer = ProfileAnswer(id=profile_id, state="Failed", steps=steps, message=why)
        with self._lock:
            self._answers[profile_id] = answer
            self._writing = False

    def _prune(self, written: int) -> None:
        """Keep this attempt's newest KEPT_TRACES traces (`written` the newest)."""
        self._kept.append(written)
        while len(self._kept) > KEPT_TRACES:
            self.place.drop(self._kept.pop(0))


def _bounded_read(raw: Path) -> bytes:
    """The profiler's trace, read no further than MAX_RAW_TRACE_BYTES (OSError past it)."""
    with raw.open("rb") as f:
        data = f.read(MAX_RAW_TRACE_BYTES + 1)
    if len(data) > MAX_RAW_TRACE_BYTES:
        raw.unlink(missing_ok=True)
        raise OSError(f"the trace has more than the {MAX_RAW_TRACE_BYTES} bytes read: not kept")
    return data


def _compress(data: bytes, path: Path) -> int:
    """gzip `data` to `path` through a temporary file (never a half-written trace, never one
    over MAX_TRACE_BYTES: OSError); its size."""
    tmp = path.with_name(f".tmp-{os.getpid()}-{int(time.time())}-{path.name}")
    with gzip.open(tmp, "wb", compresslevel=6) as dst:
        dst.write(data)
    size = tmp.stat().st_size
    if size > MAX_TRACE_BYTES:
        tmp.unlink(missing_ok=True)
        raise OSError(f"the compressed trace has {size} bytes, more than the {MAX_TRACE_BYTES} kept")
    with tmp.open("rb") as f:
        os.fsync(f.fileno())
    tmp.replace(path)
    return size
