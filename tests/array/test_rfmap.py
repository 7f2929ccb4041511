import pytest
from hypothesis import given, strategies as st

from cotsdl.array.box import Box
from cotsdl.array.rfmap import RFMap

pairs = lambda lo, hi: st.tuples(st.integers(lo, hi), st.integers(lo, hi))  # noqa: E731


@st.composite
def layer_and_input(draw):
    window = draw(pairs(1, 6))
    stride = draw(pairs(1, 4))
    block = draw(pairs(1, 3))
    pad = draw(st.tuples(st.integers(0, window[0] - 1), st.integers(0, window[1] - 1)))
    rf = RFMap(window, stride, block, pad, mixes_channels=draw(st.booleans()))
    h = draw(st.integers(window[0], 30))
    w = draw(st.integers(window[1], 30))
    in_shape = (h, w, draw(st.integers(1, 4)), draw(st.integers(1, 5)))
    return rf, in_shape


@st.composite
def out_box(draw, rf, in_shape):
    oh, ow = rf.out_extent(in_shape[:2])
    k = draw(st.integers(1, 4)) if rf.mixes_channels else in_shape[2]
    lo = [draw(st.integers(0, e - 1)) for e in (oh, ow, k, in_shape[3])]
    hi = [draw(st.integers(l + 1, e)) for l, e in zip(lo, (oh, ow, k, in_shape[3]))]
    return Box(lo, hi)


def brute_input(rf, box, in_shape):
    """Union of the input pixels read by every output pixel of box, by enumeration."""
    rows, cols = set(), set()
    for i in range(box.lo[0], box.hi[0]):
        s = i // rf.block[0]
        rows |= {r for r in range(s * rf.stride[0] - rf.pad[0], s * rf.stride[0] - rf.pad[0] + rf.window[0])
                 if 0 <= r < in_shape[0]}
    for j in range(box.lo[1], box.hi[1]):
        s = j // rf.block[1]
        cols |= {c for c in range(s * rf.stride[1] - rf.pad[1], s * rf.stride[1] - rf.pad[1] + rf.window[1])
                 if 0 <= c < in_shape[1]}
    return rows, cols


@given(layer_and_input(), st.data())
def test_input_box_is_exactly_the_pixels_read(li, data):
    rf, in_shape = li
    box = data.draw(out_box(rf, in_shape))
    got = rf.input_box(box, in_shape)
    rows, cols = brute_input(rf, box, in_shape)
    assert (got.lo[0], got.hi[0]) == (min(rows), max(rows) + 1)
    assert (got.lo[1], got.hi[1]) == (min(cols), max(cols) + 1)
    assert (got.lo[3], got.hi[3]) == (box.lo[3], box.hi[3])
    if rf.mixes_channels:
        assert (got.lo[2], got.hi[2]) == (0, in_shape[2])
    else:
        assert (got.lo[2], got.hi[2]) == (box.lo[2], box.hi[2])


@given(layer_and_input(), st.data())
def test_window_of_union_is_hull_of_windows(li, data):
    rf, in_shape = li
    a = data.draw(out_box(rf, in_shape))
    b = data.draw(out_box(rf, in_shape))
    assert rf.input_box(a.hull(b), in_shape) == rf.input_box(a, in_shape).hull(rf.input_box(b, in_shape))


@given(layer_and_input())
def test_whole_output_needs_input_inside_array(li):
    rf, in_shape = li
    oh, ow = rf.out_extent(in_shape[:2])
    whole = Box((0, 0, 0, 0), (oh, ow, 1 if rf.mixes_channels else in_shape[2], in_shape[3]))
    assert Box.from_shape(in_shape).contains(rf.input_box(whole, in_shape))


def test_sites_follow_design_formula():
    rf = RFMap((18, 18), (2, 2), (4, 4))
    assert rf.sites((200, 200)) == ((200 - 18) // 2 + 1,) * 2
    assert rf.out_extent((200, 200)) == (92 * 4, 92 * 4)
    lcn = RFMap((5, 5), (1, 1), (1, 1), (2, 2))
    assert lcn.out_extent((7, 9)) == (7, 9)
    assert rf.input_box(Box.empty(4), (200, 200, 3, 8)).is_empty


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="stride"):
        RFMap((3, 3), (0, 1))
    with pytest.raises(ValueError, match="window"):
        RFMap((3,))
