import itertools

import numpy as np
import pytest
from hypothesis import given, strategies as st

from cotsdl.array.box import Box, grow, hull_of


def boxes(ndim=None, lo=-6, hi=12):
    def build(n):
        return st.tuples(st.lists(st.integers(lo, hi), min_size=n, max_size=n),
                         st.lists(st.integers(lo, hi), min_size=n, max_size=n)).map(lambda t: Box(*t))
    if ndim is None:
        return st.integers(1, 4).flatmap(build)
    return build(ndim)


def same_rank_pair():
    return st.integers(1, 4).flatmap(lambda n: st.tuples(boxes(n), boxes(n)))


def points(box):
    return set(itertools.product(*(range(l, h) for l, h in zip(box.lo, box.hi))))


@given(same_rank_pair())
def test_intersection_commutes_and_lies_in_both(pair):
    a, b = pair
    i = a & b
    assert i == b & a
    assert a.contains(i) and b.contains(i)
    assert points(i) == points(a) & points(b)


@given(same_rank_pair())
def test_overlaps_is_a_nonempty_intersection(pair):
    a, b = pair
    assert a.overlaps(b) == b.overlaps(a) == (not (a & b).is_empty) == bool(points(a) & points(b))


@given(same_rank_pair())
def test_hull_contains_both_and_is_smallest(pair):
    a, b = pair
    h = a.hull(b)
    assert h.contains(a) and h.contains(b)
    pts = points(a) | points(b)
    if pts:
        for ax in range(a.ndim):
            assert h.lo[ax] == min(p[ax] for p in pts) and h.hi[ax] == max(p[ax] for p in pts) + 1


@given(boxes())
def test_shape_size_empty(b):
    assert b.size == len(points(b))
    assert b.is_empty == (b.size == 0)
    assert all(s >= 0 for s in b.shape)


@given(boxes(), st.data())
def test_translate_and_slices_in(b, data):
    off = data.draw(st.lists(st.integers(-5, 5), min_size=b.ndim, max_size=b.ndim))
    t = b.translate(off)
    assert t.shape == b.shape
    assert t.lo == tuple(l + o for l, o in zip(b.lo, off)) and t.hi == tuple(h + o for h, o in zip(b.hi, off))
    assert points(t) == {tuple(p + o for p, o in zip(pt, off)) for pt in points(b)}
    outer = grow(b.hull(t), [2] * b.ndim, [1] * b.ndim, Box([-100] * b.ndim, [100] * b.ndim))
    arr = np.arange(outer.size).reshape(outer.shape) if not outer.is_empty else None
    if arr is not None and not b.is_empty:
        view = arr[b.slices_in(outer)]
        assert view.shape == b.shape
        # the first element of the view is the global point b.lo
        idx = tuple(l - o for l, o in zip(b.lo, outer.lo))
        assert view[(0,) * b.ndim] == arr[idx]


def test_slices_in_rejects_outside():
    with pytest.raises(ValueError, match="not inside"):
        Box((0, 0), (3, 3)).slices_in(Box((1, 0), (3, 3)))


def test_empty_boxes_compare_equal_and_keep_their_other_extents():
    assert Box((3, 1), (3, 5)) == Box((0, 7), (2, 7)) == Box.empty(2)
    assert len({Box((3, 1), (3, 5)), Box.empty(2)}) == 1
    assert Box((3, 1), (2, 5)).shape == (0, 4)  # clamped, the other axis kept
    assert Box((2, 0, 0, 0), (2, 5, 3, 4)).shape == (0, 5, 3, 4)
    assert Box((5, 5), (6, 6)).contains(Box.empty(2))
    assert repr(Box.empty(2)) == "Box.empty(2)"


def test_rank_mismatch_is_an_error():
    with pytest.raises(ValueError):
        Box((0,), (1, 2))
    with pytest.raises(ValueError):
        Box((0,), (1,)) & Box((0, 0), (1, 1))


@given(boxes(), st.data())
def test_grow_is_clipped_and_contains(b, data):
    bounds = Box([-6] * b.ndim, [12] * b.ndim)
    before = data.draw(st.lists(st.integers(0, 4), min_size=b.ndim, max_size=b.ndim))
    after = data.draw(st.lists(st.integers(0, 4), min_size=b.ndim, max_size=b.ndim))
    g = grow(b, before, after, bounds)
    assert bounds.contains(g)
    assert g.contains(b & bounds)
    if not b.is_empty:
        assert g.lo == tuple(max(l - x, m) for l, x, m in zip(b.lo, before, bounds.lo))
        assert g.hi == tuple(min(h + x, m) for h, x, m in zip(b.hi, after, bounds.hi)) or g.is_empty


@given(st.lists(boxes(2), min_size=1, max_size=5))
def test_hull_of_many(bs):
    h = hull_of(bs)
    assert all(h.contains(b) for b in bs)


@given(boxes())
def test_tuple_roundtrip(b):
    assert Box.from_tuple(b.to_tuple()) == b


@st.composite
def box_in_outer(draw):
    """A non-empty box ``outer`` and a box inside it (extents often 1, so size-1 axes are tried)."""
    n = draw(st.integers(1, 5))
    lo = draw(st.lists(st.integers(-3, 3), min_size=n, max_size=n))
    ext = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    outer = Box(lo, [l + e for l, e in zip(lo, ext)])
    a = [draw(st.integers(l, h)) for l, h in zip(outer.lo, outer.hi)]
    b = [draw(st.integers(x, h)) for x, h in zip(a, outer.hi)]
    return Box(a, b), outer


@given(box_in_outer(), st.sampled_from([np.float32, np.float64, np.int8]))
def test_is_contiguous_in_agrees_with_numpy(pair, dtype):
    box, outer = pair
    arr = np.zeros(outer.shape, dtype)
    if not box.is_empty:
        assert box.is_contiguous_in(outer) == arr[box.slices_in(outer)].flags.c_contiguous
    else:
        assert box.is_contiguous_in(outer)  # nothing to send is trivially one run


def test_is_contiguous_in_examples_and_outside():
    win = Box((0, 0, 0, 0), (6, 5, 2, 3))
    assert Box((1, 0, 0, 0), (3, 5, 2, 3)).is_contiguous_in(win)  # whole rows
    assert Box((2, 1, 0, 0), (3, 4, 2, 3)).is_contiguous_in(win)  # part of one row
    assert not Box((1, 1, 0, 0), (3, 4, 2, 3)).is_contiguous_in(win)  # columns of several rows
    assert not Box((0, 0, 0, 0), (6, 5, 1, 3)).is_contiguous_in(win)
    with pytest.raises(ValueError, match="not inside"):
        Box((0, 0, 0, 0), (7, 5, 2, 3)).is_contiguous_in(win)
