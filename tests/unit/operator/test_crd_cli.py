"""`mpjob crd --out PATH`: a path it cannot write is named, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpjob.cli import main

pytestmark = pytest.mark.unit


def test_a_path_that_cannot_be_written_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a-file").write_text("kept\n")
    target = tmp_path / "a-file" / "crd.yaml"
    assert main(["crd", "--out", str(target)]) == 1
    assert capsys.readouterr().out == f"error: --out {target}: cannot write it (File exists: {target.parent})\n"
    assert (tmp_path / "a-file").read_text() == "kept\n"


def test_a_writable_path_gets_the_crd(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "deep" / "crd.yaml"
    assert main(["crd", "--out", str(target)]) == 0
    assert capsys.readouterr().out == f"wrote {target}\n" and "CustomResourceDefinition" in target.read_text()
