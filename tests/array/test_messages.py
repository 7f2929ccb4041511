from hypothesis import given, strategies as st

from cotsdl.array.box import Box, grow
from cotsdl.array.partition import block_boxes
from cotsdl.array.messages import partition_error, transfers, window_error


@st.composite
def layouts(draw):
    shape = tuple(draw(st.integers(1, 12)) for _ in range(2)) + (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    p = draw(st.integers(1, 6))
    dims_src = draw(st.sampled_from([(a, p // a) for a in range(1, p + 1) if p % a == 0]))
    dims_dst = draw(st.sampled_from([(a, p // a) for a in range(1, p + 1) if p % a == 0]))
    owned = block_boxes(shape, dims_src)
    gbox = Box.from_shape(shape)
    windows = []
    for b in block_boxes(shape, dims_dst):
        before = [draw(st.integers(0, 3)), draw(st.integers(0, 3))]
        after = [draw(st.integers(0, 3)), draw(st.integers(0, 3))]
        windows.append(grow(b, before, after, gbox))
    return shape, owned, windows


@given(layouts())
def test_every_window_cell_arrives_exactly_once(layout):
    shape, owned, windows = layout
    gbox = Box.from_shape(shape)
    for r in range(len(owned)):
        assert partition_error(r, owned, gbox) is None
        assert window_error(r, windows, gbox) is None
        _, recvs = transfers(r, owned, windows)
        assert sum(t.box.size for t in recvs) == windows[r].size
        for i, a in enumerate(recvs):
            assert windows[r].contains(a.box) and owned[a.peer].contains(a.box)
            for b in recvs[i + 1:]:
                assert (a.box & b.box).is_empty


@given(layouts())
def test_sends_match_receives(layout):
    shape, owned, windows = layout
    plans = [transfers(r, owned, windows) for r in range(len(owned))]
    sent = {(r, t.peer, t.box) for r, (s, _) in enumerate(plans) for t in s}
    recv = {(t.peer, r, t.box) for r, (_, rv) in enumerate(plans) for t in rv}
    assert sent == recv


def test_partition_errors_are_explained():
    gbox = Box.from_shape((4, 4, 1, 1))
    overlap = [Box((0, 0, 0, 0), (3, 4, 1, 1)), Box((2, 0, 0, 0), (4, 4, 1, 1))]
    assert "overlap" in partition_error(0, overlap, gbox)
    gap = [Box((0, 0, 0, 0), (1, 4, 1, 1)), Box((2, 0, 0, 0), (4, 4, 1, 1))]
    assert "cover" in partition_error(0, gap, gbox)
    outside = [Box((0, 0, 0, 0), (5, 4, 1, 1))]
    assert "outside" in partition_error(0, outside, gbox)
    assert "outside" in window_error(0, [Box((-1, 0, 0, 0), (2, 2, 1, 1))], gbox)
