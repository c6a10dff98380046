"""Launcher runs for tests: the real `mpjob-launch` in a subprocess over stand-in ranks
(launcher_scripts/rank.py) or the real trainer, its stdout, stderr and the pod's report in a folder."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpjob_contract.report import TerminationReport
from tests.unit.trainer.conftest import parse

LAUNCHER = Path(sys.executable).with_name("mpjob-launch")
RANK_SCRIPT = Path(__file__).with_name("launcher_scripts") / "rank.py"


@dataclass
class Pod:
    """One launcher run: its process, stdout/stderr files and the pod's termination report."""

    proc: subprocess.Popen[bytes]
    folder: Path

    def wait(self, timeout: float) -> tuple[int, TerminationReport | None]:
        code = self.proc.wait(timeout=timeout)
        path = self.folder / "pod.json"
        return code, TerminationReport.parse_message(path.read_text()) if path.exists() else None

    @property
    def stderr(self) -> str:
        return (self.folder / "stderr").read_text()

    @property
    def events(self) -> list[dict[str, Any]]:
        return parse((self.folder / "stdout").read_text())

    def child_pid(self, rank: int) -> int:
        found = re.search(rf"rank {rank} \(local \d+, world \d+\) started: pid (\d+)", self.stderr)
        assert found, self.stderr
        return int(found.group(1))


def launch(
    folder: Path,
    flags: list[str],
    command: list[str],
    env: dict[str, str] | None = None,
    pending: signal.Signals | None = None,
) -> Pod:
    """Start the launcher; `pending`: a signal already sent to it before its exec, held pending
    by the mask it starts with (a mask and pending signals survive exec) until it unblocks it."""
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(env or os.environ)
    env.setdefault("MPJOB_TERMINATION_LOG", str(folder / "pod.json"))
    with (folder / "stdout").open("wb") as out, (folder / "stderr").open("wb") as err:
        argv = [str(LAUNCHER), *flags, "--", *command]
        hold = None if pending is None else _sent_while_blocked(pending)
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=err, preexec_fn=hold)
    return Pod(proc, folder)


def _sent_while_blocked(sig: signal.Signals) -> Callable[[], None]:
    """Run in the forked child before exec: block `sig`, then send it to itself."""

    def hold() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
        os.kill(os.getpid(), sig)

    return hold


def stand_ins(tmp: Path, *behaviours: str) -> list[str]:
    return [sys.executable, str(RANK_SCRIPT), str(tmp), *behaviours]
