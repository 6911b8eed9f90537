"""hvdtrain/sharding.py: the split of a flat buffer among workers, checked element by
element against a buffer laid out by hand."""

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hvdtrain.sharding import Piece, ShardLayout


def owners(sizes: tuple[int, ...], world_size: int) -> dict[tuple[int, int], list[int]]:
    """(tensor, element) -> the ranks whose pieces hold it."""
    held: dict[tuple[int, int], list[int]] = {}
    for rank in range(world_size):
        for piece in ShardLayout(sizes, world_size, rank).pieces():
            for i in range(piece.length):
                held.setdefault((piece.tensor, piece.tensor_offset + i), []).append(rank)
    return held


@given(st.lists(st.integers(1, 40), min_size=1, max_size=6).map(tuple), st.integers(1, 9))
def test_every_element_has_exactly_one_owner_in_buffer_order(sizes, world_size):
    held = owners(sizes, world_size)
    assert set(held) == {(t, e) for t, size in enumerate(sizes) for e in range(size)}
    assert all(len(ranks) == 1 for ranks in held.values())
    shard = ShardLayout(sizes, world_size, 0).shard_length
    position = 0  # the element's place in the buffer decides its rank
    for t, size in enumerate(sizes):
        for e in range(size):
            assert held[(t, e)] == [position // shard]
            position += 1


@given(st.lists(st.integers(1, 40), min_size=1, max_size=6).map(tuple), st.integers(1, 9))
def test_shards_tile_the_buffer_full_ones_first(sizes, world_size):
    layouts = [ShardLayout(sizes, world_size, rank) for rank in range(world_size)]
    assert layouts[0].start == 0 and layouts[-1].end == layouts[0].total
    for before, after in itertools.pairwise(layouts):
        assert before.end == after.start
    lengths = [layout.end - layout.start for layout in layouts]
    full = layouts[0].shard_length
    assert lengths == sorted(lengths, reverse=True) and max(lengths) == full
    assert all(layout.bounds(r) == (layouts[r].start, layouts[r].end)
               for layout in layouts for r in range(world_size))


def test_the_last_shard_holds_what_is_left():
    layout = ShardLayout((3, 5, 1), world_size=2, rank=1)  # 9 elements, shards of 5 and 4
    assert (layout.start, layout.end) == (5, 9)
    assert layout.pieces() == (Piece(1, 2, 0, 3), Piece(2, 0, 3, 1))
    assert ShardLayout((2,), world_size=3, rank=2).bounds(2) == (2, 2)  # nothing left


def test_any_workers_pieces_and_the_padded_buffer():
    """pieces(r) is what worker r's own layout says; the padded buffer gives every shard
    the full length."""
    sizes, world_size = (3, 5, 1), 4  # 9 elements: shards of 3, 3, 3 and 0
    for rank in range(world_size):
        assert ShardLayout(sizes, world_size, 0).pieces(rank) == \
            ShardLayout(sizes, world_size, rank).pieces()
    assert ShardLayout(sizes, world_size, 0).padded_total == 12
    assert ShardLayout((4,), 2, 0).padded_total == 4


@pytest.mark.parametrize(("sizes", "world_size", "rank", "message"), [
    ((), 2, 0, "at least one tensor"),
    ((3, 0), 2, 0, "number of elements"),
    ((3,), 0, 0, "world_size"),
    ((3,), 2, 2, r"rank must be an int in \[0, 2\)"),
    ((3,), 2, True, "rank must be an int"),
])
def test_a_layout_that_cannot_be_says_why(sizes, world_size, rank, message):
    with pytest.raises(ValueError, match=message):
        ShardLayout(sizes, world_size, rank)
