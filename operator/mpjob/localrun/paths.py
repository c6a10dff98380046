"""Where a local run keeps its files: --out's folder.

--out is the user's word, so it is checked before anything starts (`prepare`): a file, a folder
that cannot be made, or one holding what no run wrote is refused with what to do, and `--fresh`
deletes a folder only when it is a run's own (`mpjob run job.yaml --out . --fresh` from a
project's folder must not take the project with it). What an earlier run left is read back the
same way: a report.json or series.json it cannot read ends the run with that said, not a traceback.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from mpjob.localrun.files import read_regular, write_replacing
from mpjob_contract.api import MixedPrecisionJobStatus

#: The job whose run --out holds ({"name": metadata.name}), written as it starts.
JOB_FILE = "job.json"
#: Everything `mpjob run` writes in --out (the .tmp files: a report, series or job file being replaced).
RUN_ENTRIES = frozenset(
    {
        *(JOB_FILE, "job.tmp"),
        *("report.json", "report.tmp", "series.json", "series.tmp", "training.png"),
        *("attempts", "checkpoints"),
    }
)
#: More than a job file of a name the API server takes (253 characters) ever needs.
_JOB_FILE_BYTES = 4096
#: What a refusal of an earlier run's files suggests.
START_OVER = "start over with --fresh, or pick another --out"


class UnusableOut(Exception):
    """--out cannot hold this run; the message names the folder, what is wrong and what to do."""


@dataclass
class Paths:
    root: Path

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def report(self) -> Path:
        return self.root / "report.json"

    @property
    def series(self) -> Path:
        return self.root / "series.json"

    @property
    def plot(self) -> Path:
        return self.root / "training.png"

    def attempt(self, index: int) -> Path:
        return self.root / "attempts" / f"a{index}"

    def earlier_status(self) -> MixedPrecisionJobStatus | None:
        """The status an earlier `mpjob run` of this folder left (None: it left no report)."""
        if not self.report.exists():
            return None
        try:
            status = MixedPrecisionJobStatus.model_validate_json(self.report.read_bytes())
        except (OSError, ValidationError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else exc.errors()[0]["msg"]
            raise UnusableOut(f"{self.root}: report.json is not a run's report ({why}): {START_OVER}") from exc
        if not status.attempts:
            raise UnusableOut(f"{self.root}: report.json names no attempt to resume from: {START_OVER}")
        return status


def prepare(root: Path, *, fresh: bool, job: str) -> None:
    """--out made ready for the run of the job named `job`: a folder, emptied first with `fresh`
    when it is a run's; refused when it holds another job's run."""
    try:
        if root.exists() and not root.is_dir():
            raise UnusableOut(f"{root}: not a folder; pick a folder for the run's files")
        if fresh and root.exists():
            foreign = sorted(entry.name for entry in root.iterdir() if entry.name not in RUN_ENTRIES)
            if foreign:
                shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
                raise UnusableOut(
                    f"{root}: --fresh deletes the folder, and it holds what no run wrote ({shown}); "
                    "pick another --out, or delete it yourself"
                )
            shutil.rmtree(root)
        root.mkdir(parents=True, exist_ok=True)
        _claim(root, job)
    except OSError as exc:
        raise UnusableOut(f"{root}: cannot use it as the run's folder ({exc.strerror or exc})") from exc


def _claim(root: Path, job: str) -> None:
    """The folder's run is the job `job`'s from now on; UnusableOut when an earlier run there was
    another job's (its report would be taken for this one's, its checkpoints resumed). A folder
    of a run from before job.json was written is taken as it is."""
    data = read_regular(root / JOB_FILE, _JOB_FILE_BYTES)
    if data is None:
        write_replacing(root / JOB_FILE, json.dumps({"name": job}) + "\n")
        return
    try:
        found = json.loads(data).get("name")
    except (ValueError, AttributeError):
        found = None
    if not isinstance(found, str):
        raise UnusableOut(f"{root}: {JOB_FILE} does not name the job its run was of: {START_OVER}")
    if found != job:
        raise UnusableOut(f"{root}: it holds a run of the job {found!r}, not {job!r}: {START_OVER}")
