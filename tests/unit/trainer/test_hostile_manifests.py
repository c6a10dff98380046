"""A checkpoint's manifest is read as untrusted input: whatever is malformed in it makes that
checkpoint corrupt (logged, the previous good one used, never pruned), never a crash of the job."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mpjob_trainer.checkpoint import CheckpointStore, manifest, resume, sha256_file
from mpjob_trainer.checkpoint.migrate import FORMAT_KEY, upgrade
from mpjob_trainer.session.state import TrainingState
from tests.unit.trainer.conftest import binds_permissions, unprivileged

pytestmark = pytest.mark.unit

JOB = "ns/j/u1"
Edit = Callable[[dict[str, Any]], Any]


def _store(root: Path, log: list[dict[str, Any]] | None = None, keep: int = 5) -> CheckpointStore:
    def record(event: str, **fields: Any) -> None:
        if log is not None:
            log.append({"event": event, **fields})

    return CheckpointStore(root, keep=keep, config_digest="d1", log=record, job=JOB)


def _save(root: Path, *steps: int) -> None:
    store = _store(root)
    for step in steps:
        store.write(step, "bf16", {"step": step, "w": torch.ones(4) * step})


def _deep(manifest: dict[str, Any]) -> str:
    return "[" * 100_000 + "]" * 100_000  # json.loads: RecursionError


def _entry_not_an_object(manifest: dict[str, Any]) -> dict[str, Any]:
    return {**manifest, "files": {**manifest["files"], "notes.txt": "not an object"}}


def _files_a_list(manifest: dict[str, Any]) -> dict[str, Any]:
    return {**manifest, "files": list(manifest["files"])}


def _unknown_precision(manifest: dict[str, Any]) -> dict[str, Any]:
    return {**manifest, "precision": "fp4"}


def _negative_size(manifest: dict[str, Any]) -> dict[str, Any]:
    files = {name: {**meta, "bytes": -1} for name, meta in manifest["files"].items()}
    return {**manifest, "files": files}


def _step_a_string(manifest: dict[str, Any]) -> dict[str, Any]:
    return {**manifest, "step": str(manifest["step"])}


def _size_a_bool(manifest: dict[str, Any]) -> dict[str, Any]:
    files = {name: {**meta, "bytes": True} for name, meta in manifest["files"].items()}
    return {**manifest, "files": {**files, "notes.txt": {"sha256": "0" * 64, "bytes": True}}}


MALFORMED = [
    _deep,
    _entry_not_an_object,
    _files_a_list,
    _unknown_precision,
    _negative_size,
    _step_a_string,
    _size_a_bool,
]


def _write_raw(folder: Path, edit: Edit) -> None:
    (folder / "notes.txt").write_text("a file that is there, unlike what the manifest says of it")
    manifest = json.loads((folder / "manifest.json").read_text())
    edited = edit(manifest)
    (folder / "manifest.json").write_text(edited if isinstance(edited, str) else json.dumps(edited))


@pytest.mark.parametrize("edit", MALFORMED, ids=[e.__name__.strip("_") for e in MALFORMED])
def test_a_malformed_newest_manifest_is_a_corrupt_checkpoint_and_the_previous_one_is_used(
    tmp_path: Path, edit: Edit
) -> None:
    _save(tmp_path, 10, 20)
    _write_raw(tmp_path / "step-000000020", edit)
    log: list[dict[str, Any]] = []
    loaded = resume.load(_store(tmp_path, log), prefer=str(tmp_path / "step-000000020"))
    assert loaded is not None and loaded[0].step == 10 and loaded[1]["step"] == 10
    assert [e["event"] for e in log] == ["checkpointRejected"] and "step-000000020" in log[0]["problem"]


@pytest.mark.parametrize("edit", MALFORMED, ids=[e.__name__.strip("_") for e in MALFORMED])
def test_a_malformed_manifest_in_the_folder_neither_breaks_a_save_nor_is_pruned(tmp_path: Path, edit: Edit) -> None:
    _save(tmp_path, 10)
    _write_raw(tmp_path / "step-000000010", edit)
    before = (tmp_path / "step-000000010" / "manifest.json").read_bytes()
    store = _store(tmp_path, keep=1)
    for step in (20, 30):
        store.write(step, "bf16", {"step": step, "w": torch.zeros(4)})
    assert [s for s, _ in store.steps()] == [10, 30]  # not provably its own: neither counted nor removed
    assert (tmp_path / "step-000000010" / "manifest.json").read_bytes() == before


@pytest.mark.parametrize("relative", [True, False], ids=["dotdot", "absolute"])
def test_a_manifest_listing_a_file_outside_its_folder_is_refused_even_with_its_true_sha256(
    tmp_path: Path, relative: bool
) -> None:
    _save(tmp_path, 10, 20)
    outside = tmp_path / "step-000000010" / "state.pt"
    name = "../step-000000010/state.pt" if relative else str(outside)
    entry = {"sha256": sha256_file(outside), "bytes": outside.stat().st_size}
    _write_raw(tmp_path / "step-000000020", lambda m: {**m, "files": {**m["files"], name: entry}})
    log: list[dict[str, Any]] = []
    loaded = resume.load(_store(tmp_path, log), prefer=str(tmp_path / "step-000000020"))
    assert loaded is not None and loaded[0].step == 10
    assert "unreadable manifest" in log[0]["problem"] and "file name" in log[0]["problem"]


def test_a_listed_file_that_links_out_of_its_folder_is_refused_even_with_its_true_sha256(tmp_path: Path) -> None:
    _save(tmp_path / "ckpt", 10, 20)
    outside = tmp_path / "elsewhere.pt"
    torch.save({"step": 20, "w": torch.full((4,), 99.0)}, outside)
    newest = tmp_path / "ckpt" / "step-000000020"
    (newest / "state.pt").unlink()
    (newest / "state.pt").symlink_to(outside)
    entry = {"sha256": sha256_file(outside), "bytes": outside.stat().st_size}
    _write_raw(newest, lambda m: {**m, "files": {**m["files"], "state.pt": entry}})
    log: list[dict[str, Any]] = []
    loaded = resume.load(_store(tmp_path / "ckpt", log))
    assert loaded is not None and loaded[0].step == 10 and torch.equal(loaded[1]["w"], torch.ones(4) * 10)
    assert "step-000000020" in log[0]["problem"] and "outside the checkpoint" in log[0]["problem"]


def test_a_file_of_another_size_than_its_manifest_says_is_refused_before_it_is_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _save(tmp_path, 10, 20)
    newest = tmp_path / "step-000000020"
    _write_raw(newest, lambda m: {**m, "files": {**m["files"], "notes.txt": {"sha256": "0" * 64, "bytes": 3}}})
    hashed: list[str] = []
    monkeypatch.setattr(manifest, "sha256_file", lambda path: hashed.append(path.name) or sha256_file(path))
    log: list[dict[str, Any]] = []
    loaded = resume.load(_store(tmp_path, log))
    assert loaded is not None and loaded[0].step == 10
    assert "notes.txt is 57 bytes, its manifest says 3" in log[0]["problem"] and "notes.txt" not in hashed


@pytest.mark.parametrize(
    "planted",
    [[20, 1], {"step": "20"}, {"step": {"n": 20}}, {"step": 20.5}, {"step": torch.tensor([20, 1])}, {"w": 1}],
    ids=["a-list", "step-a-string", "step-a-dict", "step-a-float", "step-a-tensor", "no-step"],
)
def test_a_state_that_is_no_state_of_its_step_is_refused_even_with_its_true_sha256(
    tmp_path: Path, planted: Any
) -> None:
    _save(tmp_path, 10, 20)
    newest = tmp_path / "step-000000020"
    torch.save(planted, newest / "state.pt")  # weights-only loadable, and the manifest recomputed over it
    entry = {"sha256": sha256_file(newest / "state.pt"), "bytes": (newest / "state.pt").stat().st_size}
    _write_raw(newest, lambda m: {**m, "files": {**m["files"], "state.pt": entry}})
    log: list[dict[str, Any]] = []
    loaded = resume.load(_store(tmp_path, log))
    assert loaded is not None and loaded[0].step == 10 and loaded[1]["step"] == 10
    assert "step-000000020" in log[0]["problem"] and "the manifest's step 20" in log[0]["problem"]


#: Resume, then save step 30 (keep 2), in a process that file permissions bind; prints what it saw.
_RESUME_AND_SAVE = """
import json, sys, torch
from pathlib import Path
from mpjob_trainer.checkpoint import CheckpointStore, resume
log = []
store = CheckpointStore(Path(sys.argv[1]), keep=2, config_digest="d1", log=lambda e, **f: log.append(f), job="ns/j/u1")
loaded = resume.load(store)
store.write(30, "bf16", {"step": 30, "w": torch.zeros(4)})
print(json.dumps({"resumed": loaded and loaded[0].step, "problems": [e["problem"] for e in log]}))
"""


@pytest.mark.process
@binds_permissions
def test_a_checkpoint_it_cannot_read_is_skipped_for_the_previous_one_and_never_breaks_a_save(tmp_path: Path) -> None:
    _save(tmp_path, 10, 20)
    foreign = tmp_path / "step-000000025"  # copied in by another user, unreadable to the trainer
    foreign.mkdir()
    (foreign / "manifest.json").write_text("{}")
    (tmp_path / "step-000000020" / "state.pt").chmod(0)
    foreign.chmod(0)
    try:
        done = unprivileged(_RESUME_AND_SAVE, str(tmp_path))
    finally:
        foreign.chmod(0o755)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["resumed"] == 10
    assert seen["problems"] == [
        "step-000000025: cannot read manifest.json (Permission denied)",
        "step-000000020: cannot read state.pt (Permission denied)",
    ]
    assert [step for step, _ in _store(tmp_path).steps()] == [20, 25, 30]  # keep 2 of its own; 25 left as it is


def test_a_state_naming_its_own_format_is_read_in_the_format_its_manifest_gives(tmp_path: Path) -> None:
    _save(tmp_path, 10, 20)
    newest = tmp_path / "step-000000020"
    torch.save({"step": 20, "w": torch.ones(4), FORMAT_KEY: "not a version"}, newest / "state.pt")
    entry = {"sha256": sha256_file(newest / "state.pt"), "bytes": (newest / "state.pt").stat().st_size}
    _write_raw(newest, lambda m: {**m, "files": {**m["files"], "state.pt": entry}})
    loaded = resume.load(_store(tmp_path), restore=lambda loaded: None)
    assert loaded is not None and loaded[0].step == 20 and FORMAT_KEY not in loaded[1]  # format 2, as written
    assert upgrade(loaded[1], {}) == loaded[1]


def _session_state(step: int, model: torch.nn.Module) -> dict[str, Any]:
    return TrainingState({"model": model}).capture(step, step, "bf16", None)


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda s: s.pop("rng"), "holds no generator state (rng)"),
        (lambda s: s["rng"].update(torch=torch.zeros(3)), "holds a torch generator state of torch.float32 [3]"),
        (lambda s: s["rng"].update(python=[3]), "holds no Python generator state"),
        (lambda s: s["rng"].update(python=[3, [1, 2, 3], None]), "holds no Python generator state"),
        (lambda s: s["rng"].update(python=[3, ["a"] * 625, None]), "holds no Python generator state"),
        (lambda s: s["rng"]["numpy"].__setitem__(1, torch.zeros(3, dtype=torch.int64)), "no numpy generator state"),
        (lambda s: s["rng"].update(numpy=["MT19937"]), "no numpy generator state"),
        (lambda s: s.update(samples=[1]), "holds samples [1], not a count"),
        (lambda s: s.update(appliedSteps=-5), "holds appliedSteps -5, not a count"),
    ],
    ids=[
        "no-rng",
        "torch-rng",
        "python-rng",
        "python-rng-short",
        "python-rng-strings",
        "numpy-rng-short",
        "numpy-rng-cut",
        "samples",
        "applied-steps",
    ],
)
def test_a_state_whose_own_fields_are_unusable_is_passed_over_for_the_previous_one(
    tmp_path: Path, edit: Callable[[dict[str, Any]], Any], problem: str
) -> None:
    """Weights-only loadable, its manifest true to it, its step right: the SDK's own fields are
    still the file's word, checked before anything is loaded (never a KeyError out of a resume)."""
    model, store = torch.nn.Linear(2, 2), _store(tmp_path)
    for step in (10, 20):
        state = _session_state(step, model)
        if step == 20:
            edit(state)
        store.write(step, "bf16", state)
    log: list[dict[str, Any]] = []
    into = TrainingState({"model": torch.nn.Linear(2, 2)})
    loaded = resume.load(_store(tmp_path, log), restore=lambda got: into.restore(got[1], "bf16", None))
    assert loaded is not None and loaded[0].step == 10
    assert "step-000000020" in log[0]["path"] and problem in log[0]["problem"], log
