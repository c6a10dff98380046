"""What one pod's launcher starts: flags and environment -> a LaunchPlan, and each rank's env.

Each setting is read from its flag, else its environment variable, else the attempt
description (MPJOB_LAUNCH), else a default; a bad value is a LaunchConfigError that names
the flag (and the variable it came from), which the launcher turns into exit 43.

Standard library only at import: the attempt description is parsed (pydantic) only when a
setting falls back to it; the operator's pods pass every setting as a flag.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, NoReturn

from mpjob_contract.environment import LAUNCH_ENV, TERMINATION_LOG_ENV
from mpjob_contract.formats import whole_number

if TYPE_CHECKING:
    from mpjob_contract.launch import AttemptLaunch

PROCESSES_ENV = "MPJOB_PROCESSES_PER_WORKER"
WORKERS_ENV = "MPJOB_WORKERS"
GRACE_ENV = "MPJOB_LAUNCH_GRACE_SECONDS"
#: Set by Kubernetes in every pod of an Indexed Job: the pod's worker index.
INDEX_ENV = "JOB_COMPLETION_INDEX"
DEFAULT_GRACE_SECONDS = 20.0
DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = "29500"


class LaunchConfigError(Exception):
    """The launcher's flags or environment are wrong: the pod exits 43 (do not retry)."""


class LaunchPlan(NamedTuple):
    """One pod: `nproc` local copies of `command`, as worker `worker_index` of `workers`.

    (NamedTuples on the launcher's start path: `dataclasses` imports `inspect`, a sizeable
    share of the launcher's start-up CPU.)"""

    command: tuple[str, ...]
    nproc: int
    workers: int
    worker_index: int
    grace_seconds: float
    master_addr: str = DEFAULT_MASTER_ADDR
    master_port: str = DEFAULT_MASTER_PORT

    @property
    def world_size(self) -> int:
        return self.workers * self.nproc

    def global_rank(self, local_rank: int) -> int:
        return self.worker_index * self.nproc + local_rank

    def rank_env(self, local_rank: int, base: Mapping[str, str], report_path: str) -> dict[str, str]:
        """The environment torchrun would give local rank `local_rank`, plus its private report path."""
        rank = str(self.global_rank(local_rank))
        return {
            **base,
            "RANK": rank,
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.nproc),
            "GROUP_RANK": str(self.worker_index),
            "GROUP_WORLD_SIZE": str(self.workers),
            "ROLE_NAME": "default",
            "ROLE_RANK": rank,
            "ROLE_WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": self.master_port,
            TERMINATION_LOG_ENV: report_path,
        }


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting 2: a bad flag is a configuration error (43)."""

    def error(self, message: str) -> NoReturn:
        raise LaunchConfigError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mpjob-launch",
        usage="mpjob-launch [--nproc-per-worker N] [--workers W] [--worker-index I] [--grace-seconds S] -- CMD ...",
        description="Start N local ranks of CMD with torchrun's environment; fold their endings "
        "into one exit code and one termination report.",
    )
    parser.add_argument(
        "--nproc-per-worker",
        type=int,
        metavar="N",
        help=f"local processes (default: ${PROCESSES_ENV}, else processesPerWorker from ${LAUNCH_ENV}, else 1)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        metavar="W",
        help=f"pods in the attempt (default: ${WORKERS_ENV}, else spec.workers from ${LAUNCH_ENV}, else 1)",
    )
    parser.add_argument(
        "--worker-index", type=int, metavar="I", help=f"this pod's index (default: ${INDEX_ENV}, else 0)"
    )
    parser.add_argument(
        "--grace-seconds",
        type=float,
        metavar="S",
        help="seconds the siblings of a failed rank get between SIGTERM and SIGKILL "
        f"(default: ${GRACE_ENV}, else {DEFAULT_GRACE_SECONDS:g})",
    )
    return parser


def _split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    if "--" not in argv:
        return list(argv), []
    cut = list(argv).index("--")
    return list(argv[:cut]), list(argv[cut + 1 :])


class _Attempt:
    """The attempt in MPJOB_LAUNCH, parsed only when a setting falls back to it."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._launch: AttemptLaunch | None = None

    def get(self, flag: str) -> AttemptLaunch | None:
        if self.text and self._launch is None:
            from pydantic import ValidationError  # only here: the start path stays light

            from mpjob_contract.launch import AttemptLaunch

            try:
                self._launch = AttemptLaunch.model_validate_json(self.text)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "(top)"
                raise LaunchConfigError(
                    f"{flag}: ${LAUNCH_ENV} is not a valid attempt: {where}: {first['msg']}"
                ) from None
        return self._launch


class _Setting(NamedTuple):
    flag: str
    value: float
    source: str  # the flag, "$VAR" or "default"

    def said(self) -> str:
        """The value as an error message quotes it, with where it came from."""
        return f"{self.value:g}" + ("" if self.source == self.flag else f" (from {self.source})")


class _Sources(NamedTuple):
    """Where settings come from, in order: flag, environment variable, MPJOB_LAUNCH, default."""

    env: Mapping[str, str]
    attempt: _Attempt

    def setting(
        self,
        flag: str,
        given: float | None,
        name: str,
        kind: Callable[[str], float],
        default: float,
        from_launch: Callable[[AttemptLaunch], int] | None = None,
    ) -> _Setting:
        if given is not None:
            return _Setting(flag, given, flag)
        text = self.env.get(name, "").strip()
        if text:
            try:
                return _Setting(flag, kind(text), f"${name}")
            except ValueError:
                noun = "an integer" if kind is int else "a number"
                raise LaunchConfigError(f"{flag}: ${name}={text!r} is not {noun}") from None
        launch = self.attempt.get(flag) if from_launch is not None else None
        if launch is not None and from_launch is not None:
            return _Setting(flag, from_launch(launch), f"${LAUNCH_ENV}")
        return _Setting(flag, default, "default")


def _processes(launch: AttemptLaunch) -> int:
    from mpjob_contract.api import processes_per_worker  # pydantic: only when the spec is read

    return processes_per_worker(launch.spec)


def _workers(launch: AttemptLaunch) -> int:
    """The attempt's workers: fewer than spec.workers when spec.elastic runs it smaller."""
    return launch.workers or launch.spec.workers


def _master_port(env: Mapping[str, str]) -> str:
    port = env.get("MASTER_PORT", "").strip() or DEFAULT_MASTER_PORT
    if not 0 < (whole_number(port, digits=5) or 0) < 65536:
        raise LaunchConfigError(f"$MASTER_PORT={port!r} is not a TCP port")
    return port


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise LaunchConfigError(message)


def parse_plan(argv: Sequence[str], env: Mapping[str, str]) -> LaunchPlan:
    """The plan for this pod, or a LaunchConfigError naming the flag that is wrong."""
    flags, command = _split_command(argv)
    args = _parser().parse_args(flags)
    _check(bool(command), "no command: put the training command after --, e.g. mpjob-launch -- mpjob-trainer")
    sources = _Sources(env, _Attempt(env.get(LAUNCH_ENV, "")))
    nproc = sources.setting("--nproc-per-worker", args.nproc_per_worker, PROCESSES_ENV, int, 1, _processes)
    workers = sources.setting("--workers", args.workers, WORKERS_ENV, int, 1, _workers)
    index = sources.setting("--worker-index", args.worker_index, INDEX_ENV, int, 0)
    grace = sources.setting("--grace-seconds", args.grace_seconds, GRACE_ENV, float, DEFAULT_GRACE_SECONDS)
    _check(nproc.value >= 1, f"--nproc-per-worker must be at least 1, got {nproc.said()}")
    _check(workers.value >= 1, f"--workers must be at least 1, got {workers.said()}")
    _check(
        0 <= index.value < workers.value,
        f"--worker-index must be in [0, {workers.value:g}) for --workers {workers.said()}, got {index.said()}",
    )
    _check(math.isfinite(grace.value) and grace.value >= 0, f"--grace-seconds must be >= 0, got {grace.said()}")
    return LaunchPlan(
        command=tuple(command),
        nproc=int(nproc.value),
        workers=int(workers.value),
        worker_index=int(index.value),
        grace_seconds=grace.value,
        master_addr=env.get("MASTER_ADDR", "").strip() or DEFAULT_MASTER_ADDR,
        master_port=_master_port(env),
    )
