import pytest
from hypothesis import given, strategies as st

from cotsdl.array.box import Box
from cotsdl.array.partition import block_box, block_boxes, block_owner, block_range, choose_grid


@given(st.integers(0, 500), st.integers(1, 64))
def test_partition_covers_extent_exactly_once(length, parts):
    ranges = [block_range(length, parts, p) for p in range(parts)]
    assert ranges[0][0] == 0 and ranges[-1][1] == length
    for (a, b), (c, d) in zip(ranges, ranges[1:]):
        assert b == c  # contiguous, no gap, no overlap
    sizes = [b - a for a, b in ranges]
    assert max(sizes) - min(sizes) <= 1  # balanced


@given(st.integers(1, 500), st.integers(1, 64), st.data())
def test_owner_matches_ranges(length, parts, data):
    i = data.draw(st.integers(0, length - 1))
    p = block_owner(i, length, parts)
    lo, hi = block_range(length, parts, p)
    assert lo <= i < hi


@given(st.integers(1, 200))
def test_choose_grid_multiplies_out(p):
    py, px = choose_grid(p)
    assert py * px == p and py >= px


@given(st.integers(1, 200), st.integers(1, 300), st.integers(1, 300))
def test_choose_grid_with_extent_minimises_perimeter(p, h, w):
    py, px = choose_grid(p, (h, w))
    assert py * px == p
    best = min(-(-h // a) + -(-w // (p // a)) for a in range(1, p + 1) if p % a == 0)
    assert -(-h // py) + -(-w // px) == best


def test_choose_grid_examples():
    assert choose_grid(1) == (1, 1)
    assert choose_grid(3) == (3, 1)
    assert choose_grid(4) == (2, 2)
    assert choose_grid(6) == (3, 2)
    assert choose_grid(7) == (7, 1)
    assert choose_grid(4, (1000, 8)) == (4, 1)  # a tall narrow image is split in rows


@given(st.lists(st.integers(0, 30), min_size=4, max_size=4), st.integers(1, 5), st.integers(1, 5))
def test_block_boxes_tile_the_array(shape, py, px):
    bs = block_boxes(shape, (py, px))
    assert len(bs) == py * px
    total = Box.from_shape(shape)
    assert sum(b.size for b in bs) == total.size
    for i, a in enumerate(bs):
        assert total.contains(a)
        for b in bs[i + 1:]:
            assert (a & b).is_empty
        assert a.lo[2:] == (0, 0) or a.is_empty  # C and N never split


def test_bad_arguments():
    with pytest.raises(ValueError):
        block_range(10, 0, 0)
    with pytest.raises(ValueError):
        block_range(10, 3, 3)
    with pytest.raises(ValueError):
        choose_grid(0)
    with pytest.raises(ValueError):
        block_box((4, 4), (2, 2, 2), (0, 0, 0))
