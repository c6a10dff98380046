"""A single-file checkpoint's state is loaded from the very bytes its sha256 was checked on,
read once: a file replaced after the check is never loaded unchecked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mpjob_trainer.checkpoint import STATE, CheckpointStore, manifest, sha256_file

pytestmark = pytest.mark.unit


def _store(root: Path) -> CheckpointStore:
    return CheckpointStore(root, keep=5, config_digest="d1", job="ns/j/u1")


def _bytes_read() -> int:
    """What this process has read through read(2) so far (Linux: /proc/self/io)."""
    return int(
        next(line for line in Path("/proc/self/io").read_text().splitlines() if line.startswith("rchar")).split()[1]
    )


def test_a_state_replaced_after_its_check_is_not_what_is_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """state.pt swapped for a planted one of the same step right after any whole-file hash of it:
    what verify returns is the state that was hashed, never the planted one."""
    store = _store(tmp_path)
    folder = Path(store.write(5, "fp32", {"step": 5, "w": torch.ones(4)}).ref.path)
    planted = tmp_path / "planted.pt"
    torch.save({"step": 5, "w": torch.full((4,), 666.0)}, planted)

    def hash_then_swap(path: Path) -> str:
        digest = sha256_file(path)
        if path.name == STATE:
            planted.replace(path)
        return digest

    monkeypatch.setattr(manifest, "sha256_file", hash_then_swap)
    _, state = store.verify(folder)
    assert torch.equal(state["w"], torch.ones(4)), state["w"]


def test_a_state_is_read_once(tmp_path: Path) -> None:
    """Checking and loading an 8 MB state reads its file once, not twice."""
    store = _store(tmp_path)
    folder = Path(store.write(5, "fp32", {"step": 5, "w": torch.randn(2_000_000)}).ref.path)
    size = (folder / STATE).stat().st_size
    before = _bytes_read()
    _, state = store.verify(folder)
    read = _bytes_read() - before
    assert state["w"].numel() == 2_000_000
    assert size <= read < 1.5 * size, (read, size)


def test_a_loaded_state_holds_its_own_values_after_the_checkpoint_is_gone(tmp_path: Path) -> None:
    """The loaded tensors hold the values checked, whatever becomes of the files afterwards."""
    store = _store(tmp_path)
    saved: dict[str, Any] = {"step": 5, "w": torch.arange(1000.0), "rng": [torch.ones(3, dtype=torch.uint8)]}
    folder = Path(store.write(5, "fp32", saved).ref.path)
    _, state = store.verify(folder)
    (folder / STATE).write_bytes(b"\0" * (folder / STATE).stat().st_size)
    (folder / STATE).unlink()
    assert torch.equal(state["w"], saved["w"]) and torch.equal(state["rng"][0], saved["rng"][0])
    state["w"] += 1  # the loaded tensors are the run's to change
    assert state["w"][0] == 1.0
