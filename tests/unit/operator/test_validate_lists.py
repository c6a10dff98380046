"""`kind: List` manifests, as `kubectl get -o yaml` writes several objects: `mpjob validate`
checks the MixedPrecisionJobs among the items (their fields named items[i]...) and names the
other kinds as skipped; `mpjob run` refuses a List, or a document of another kind, naming its kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpjob.cli import main
from mpjob.localrun.cli import run_command
from tests.unit.operator.cases import GOOD, bad

pytestmark = pytest.mark.unit

CLAIM = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "checkpoints"}}


def as_list(*items: dict[str, Any]) -> str:
    """The List `kubectl get -o yaml` writes (each item written out: no YAML aliases)."""
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": json.loads(json.dumps(items))})


def test_validate_checks_the_jobs_of_a_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    listed = tmp_path / "jobs.yaml"
    listed.write_text(as_list(GOOD, CLAIM, GOOD))
    assert main(["validate", str(listed)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{listed} items[1]: skipped: PersistentVolumeClaim checkpoints (not a MixedPrecisionJob)",
        f"{listed}: ok (2 MixedPrecisionJobs)",
    ]
    listed.write_text(yaml.safe_dump(CLAIM) + "---\n" + as_list(GOOD, bad("spec.workers", 0)))
    assert main(["validate", str(listed)]) == 1
    said = capsys.readouterr().out
    assert f"{listed} (document 2): items[1].spec.workers: " in said, said
    listed.write_text(as_list(CLAIM))
    assert main(["validate", str(listed)]) == 1  # a List of other kinds holds no job
    assert f"{listed}: no MixedPrecisionJob, only other kinds" in capsys.readouterr().out


@pytest.mark.parametrize(("items", "jobs"), [((GOOD,), 1), ((GOOD, CLAIM, GOOD), 2)])
def test_run_refuses_a_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], items: tuple[dict[str, Any], ...], jobs: int
) -> None:
    """`mpjob run` takes one MixedPrecisionJob's own manifest: a List, even of one job, is refused
    before anything is written, in one error that says what it holds and what to give instead."""
    listed = tmp_path / "jobs.yaml"
    listed.write_text(as_list(*items))
    assert run_command([str(listed), "--out", str(tmp_path / "out"), "--json"]) == 2
    said = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    holds = f"a List of {len(items)} item(s), {jobs} of them MixedPrecisionJob(s): `mpjob run` runs one"
    assert len(said) == 1 and said[0]["field"] == "kind" and holds in said[0]["message"], said
    assert "kubectl get mpj NAME -o yaml" in said[0]["message"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("beside_a_job", [True, False])
def test_run_refuses_another_kind_saying_what_it_is_not_that_its_header_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], beside_a_job: bool
) -> None:
    """A PersistentVolumeClaim applied beside the job is no job written wrong: one error says what
    it is and what `mpjob run` takes, not its apiVersion and kind as fields to change."""
    mixed = tmp_path / "job.yaml"
    mixed.write_text(yaml.safe_dump(CLAIM) + ("---\n" + yaml.safe_dump(GOOD) if beside_a_job else ""))
    assert run_command([str(mixed), "--out", str(tmp_path / "out"), "--json"]) == 2
    said = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(s["field"], s["message"]) for s in said] == [
        (
            "kind",
            f"{mixed}: kind: a PersistentVolumeClaim checkpoints, not a MixedPrecisionJob: `mpjob run` takes a "
            "file of one MixedPrecisionJob and nothing else; give it the job's own file (apply the other objects "
            "with kubectl)",
        )
    ], said
    assert not (tmp_path / "out").exists()
