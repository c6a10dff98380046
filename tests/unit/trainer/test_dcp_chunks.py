"""A tensor in DCP's index is taken only when its chunks cover each of its elements once: DCP
reads what the chunks name and nothing else, so a tensor left uncovered would keep the run's
own values without a word."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorProperties, TensorStorageMetadata

from mpjob_trainer.checkpoint.dcp_chunks import MAX_CHUNKS, covered

pytestmark = pytest.mark.unit

Box = tuple[tuple[int, ...], tuple[int, ...]]


def entry(size: tuple[int, ...], *boxes: Box) -> TensorStorageMetadata:
    chunks = [ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s)) for o, s in boxes]
    return TensorStorageMetadata(properties=TensorProperties(dtype=torch.float32), size=torch.Size(size), chunks=chunks)


@pytest.mark.parametrize(
    ("size", "boxes"),
    [
        ((8, 4), [((0, 0), (8, 4))]),  # one rank's whole tensor
        ((8, 4), [((0, 0), (3, 4)), ((3, 0), (3, 4)), ((6, 0), (2, 4))]),  # FSDP2 along rows, the last short
        ((2, 4), [((0, 0), (1, 4)), ((1, 0), (1, 4)), ((2, 0), (0, 4)), ((2, 0), (0, 4))]),  # ranks with none
        ((4, 4), [((2, 2), (2, 2)), ((0, 0), (2, 2)), ((0, 2), (2, 2)), ((2, 0), (2, 2))]),  # 2-D, any order
        ((), [((), ())]),  # a scalar
        ((0, 4), []),  # an empty tensor
    ],
    ids=["whole", "rows", "empty-shards", "tiles", "scalar", "empty"],
)
def test_chunks_as_dcp_writes_them_cover_their_tensor(size: tuple[int, ...], boxes: list[Box]) -> None:
    assert covered(entry(size, *boxes))


@pytest.mark.parametrize(
    ("size", "boxes"),
    [
        ((8, 4), []),
        ((8, 4), [((0, 0), (4, 4))]),  # half of it
        ((8, 4), [((0, 0), (5, 4)), ((4, 0), (3, 4))]),  # a row twice, the last never: as many elements
        ((8, 4), [((0, 0), (8, 4)), ((0, 0), (0, 4)), ((0, 0), (8, 4))]),  # all of it twice
        ((8, 4), [((4, 0), (8, 4))]),  # outside it
        ((8, 4), [((-4, 0), (12, 4))]),
        ((8, 4), [((0,), (32,))]),  # of another rank
        ((4, 4), [((0, 0), (2, 4)), ((2, 0), (2, 2)), ((1, 2), (2, 2))]),  # 2-D: a tile over another
        ((), [((), ()), ((), ())]),
    ],
    ids=["none", "half", "row-twice", "whole-twice", "outside", "negative", "rank", "tile-over", "scalar-twice"],
)
def test_chunks_that_leave_out_or_read_twice_an_element_do_not(size: tuple[int, ...], boxes: list[Box]) -> None:
    assert not covered(entry(size, *boxes))


def test_chunks_of_the_wrong_types_or_too_many_do_not() -> None:
    odd = entry((8,), ((0,), (8,)))
    odd.chunks[0].sizes = [8]  # type: ignore[assignment]  # unpickled: anything
    assert not covered(odd)
    many = entry((MAX_CHUNKS + 1,), *[((i,), (1,)) for i in range(MAX_CHUNKS + 1)])
    assert not covered(many) and covered(entry((MAX_CHUNKS,), *[((i,), (1,)) for i in range(MAX_CHUNKS)]))
