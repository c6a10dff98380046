"""The keys of a bucket checkpoint's objects (checkpoint.objects): a writer's own folder, named by
its manifest and checked before any key is made from it, and what deleting a set-aside
checkpoint may delete. The store's behaviour on a real S3 server: tests/integration/storage."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint, Manifest, parse_manifest
from mpjob_trainer.checkpoint.objects import (
    ASIDE,
    aside_name,
    aside_step,
    file_keys,
    new_writer,
    place_prefix,
    unshared,
)

pytestmark = pytest.mark.unit

FILE = {"sha256": "0" * 64, "bytes": 1}
STEP = "job/step-000000020"


def _manifest(step: int = 20, writer: str | None = None, *names: str) -> Manifest:
    return Manifest(step, "bf16", "d1", 2, {name: FILE for name in names or ("state.pt",)}, "ns/j/u", writer=writer)


def test_a_writers_folder_survives_its_manifests_round_trip_and_names_the_keys() -> None:
    writer = new_writer()
    manifest = parse_manifest(json.dumps(_manifest(20, writer).to_json()).encode(), "step-000000020")
    assert manifest.writer == writer and new_writer() != writer
    assert file_keys(STEP, manifest) == [f"{STEP}/{writer}/state.pt"]
    assert file_keys(STEP, replace(manifest, writer=None)) == [f"{STEP}/state.pt"]  # written before writers
    assert "writer" not in _manifest().to_json()  # a volume's manifest is as it was


@pytest.mark.parametrize("writer", ["..", "w-../../other", "w-0123456789ab/x", "/w-0123456789ab", "", 7])
def test_a_manifest_whose_writer_could_leave_the_steps_prefix_is_corrupt(writer: object) -> None:
    body = {**_manifest().to_json(), "writer": writer}
    with pytest.raises(CorruptCheckpoint, match="writer"):
        parse_manifest(json.dumps(body).encode(), "step-000000020")


def test_a_set_aside_name_sorts_by_step_then_time_and_nothing_else_is_one() -> None:
    names = [aside_name(20), aside_name(20), aside_name(3)]
    assert [aside_step(name) for name in names] == [20, 20, 3]
    assert sorted(names) == [names[2], names[0], names[1]]
    for odd in ("step-000000020", "step-000000020-1-ab", f"{names[0]}\n", f"../{names[0]}"):
        assert aside_step(odd) is None
    assert place_prefix("job", f"s3://b/job/{ASIDE}/{names[0]}") == f"job/{ASIDE}/{names[0]}"
    assert place_prefix("job", "s3://b/job/step-000000020") == STEP


def test_deleting_a_set_aside_checkpoint_spares_what_the_steps_committed_one_names() -> None:
    aside = _manifest(20, None, "state.pt", "framework/a")
    assert unshared(STEP, aside, None) == [f"{STEP}/state.pt", f"{STEP}/framework/a"]
    assert unshared(STEP, aside, _manifest(20, None, "framework/a")) == [f"{STEP}/state.pt"]
    assert unshared(STEP, aside, _manifest(20, new_writer())) == [f"{STEP}/state.pt", f"{STEP}/framework/a"]
    assert unshared(STEP, _manifest(30), None) == []  # a copy of another step's: names nothing of this one
