"""Launcher runs for tests: the real `mpjob-launch` in a subprocess over stand-in ranks
(launcher_scripts/rank.py) or the real trainer, its stdout, stderr and the pod's report in a folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
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


def launch(folder: Path, flags: list[str], command: list[str], env: dict[str, str] | None = None) -> Pod:
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(env or os.environ)
    env.setdefault("MPJOB_TERMINATION_LOG", str(folder / "pod.json"))
    with (folder / "stdout").open("wb") as out, (folder / "stderr").open("wb") as err:
        proc = subprocess.Popen([str(LAUNCHER), *flags, "--", *command], env=env, stdout=out, stderr=err)
    return Pod(proc, folder)


def stand_ins(tmp: Path, *behaviours: str) -> list[str]:
    return [sys.executable, str(RANK_SCRIPT), str(tmp), *behaviours]
