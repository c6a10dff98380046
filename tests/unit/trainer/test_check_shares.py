"""How the ranks split the sha256 checks of a sharded checkpoint (checkpoint.manifest.share_of):
every file is checked by exactly one rank, whatever the world size that reads it, and on the
world size that wrote it each rank checks its own files (a bucket's restore fetches no more)."""

from __future__ import annotations

import pytest

from mpjob_trainer.checkpoint.manifest import share_of

pytestmark = pytest.mark.unit


def files(writers: int) -> list[str]:
    own = [name for rank in range(writers) for name in (f"__{rank}_0.distcp", f"rank-{rank:05d}.pt")]
    return [".metadata", *own, "framework/extra.bin"]


@pytest.mark.parametrize(("writers", "readers"), [(1, 1), (2, 2), (4, 2), (2, 4), (3, 2), (4, 1), (8, 8)])
def test_every_file_is_checked_by_exactly_one_reader(writers: int, readers: int) -> None:
    shares = [share_of(files(writers), rank, readers) for rank in range(readers)]
    checked = [name for share in shares for name in share]
    assert sorted(checked) == sorted(files(writers))


def test_on_the_world_size_that_wrote_it_each_rank_checks_its_own_files() -> None:
    for rank in range(4):
        own = {f"__{rank}_0.distcp", f"rank-{rank:05d}.pt"}
        assert own <= set(share_of(files(4), rank, 4))
        assert not any(name.startswith(("__", "rank-")) and name not in own for name in share_of(files(4), rank, 4))
