"""The pure layout of a network on a grid, and the interior/border split the overlap uses."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cotsdl.array.box import Box
from cotsdl.array.partition import block_box
from cotsdl.nn.layers import L2Pool, LocalFilter
from cotsdl.nn.layout import split_sites, site_output_box


@st.composite
def cases(draw):
    kind = draw(st.sampled_from(["filter", "pool"]))
    r = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    H, W = draw(st.integers(r[0], 30)), draw(st.integers(r[1], 30))
    layer = (LocalFilter(r, s, 2, (draw(st.integers(1, 3)), draw(st.integers(1, 3)))) if kind == "filter"
             else L2Pool(r, s, 0.1))
    in_shape = (H, W, 2, 3)
    UH, UW = layer.sites(in_shape)
    dims = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    coords = (draw(st.integers(0, dims[0] - 1)), draw(st.integers(0, dims[1] - 1)))
    sites = block_box((UH, UW), dims, coords)
    ready_dims = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    ready = block_box(in_shape, ready_dims, (draw(st.integers(0, ready_dims[0] - 1)),
                                             draw(st.integers(0, ready_dims[1] - 1))))
    return layer, in_shape, sites, ready


@settings(max_examples=300, deadline=None)
@given(cases())
def test_interior_needs_only_ready_input_and_the_parts_tile_the_units(case):
    layer, in_shape, sites, ready = case
    out_shape = layer.out_shape(in_shape)
    inner, strips = split_sites(layer, in_shape, sites, ready)
    parts = ([inner] if not inner.is_empty else []) + strips
    cover = np.zeros(layer.sites(in_shape), int)
    for b in parts:
        assert sites.contains(b) and not b.is_empty
        cover[b.slices_in(Box((0, 0), cover.shape))] += 1
    want = np.zeros_like(cover)
    if not sites.is_empty:
        want[sites.slices_in(Box((0, 0), cover.shape))] = 1
    np.testing.assert_array_equal(cover, want)  # exactly once each
    if not inner.is_empty:
        need = layer.rf.input_box(site_output_box(layer, inner, out_shape), in_shape)
        assert ready.contains(Box(need.lo[:2] + ready.lo[2:], need.hi[:2] + ready.hi[2:]))
        # and it is the largest such box: one more unit on any side would need input not ready
        for a in (0, 1):
            for grow_lo in (True, False):
                lo, hi = list(inner.lo), list(inner.hi)
                if grow_lo:
                    lo[a] -= 1
                else:
                    hi[a] += 1
                bigger = Box(tuple(lo), tuple(hi))
                if sites.contains(bigger):
                    need = layer.rf.input_box(site_output_box(layer, bigger, out_shape), in_shape)
                    assert not ready.contains(Box(need.lo[:2] + ready.lo[2:], need.hi[:2] + ready.hi[2:]))


@given(lo0=st.integers(0, 5), lo1=st.integers(0, 5), rows=st.integers(0, 9), cols=st.integers(1, 6),
       pieces=st.integers(1, 6))
def test_interior_pieces_tile_the_interior_in_row_order(lo0, lo1, rows, cols, pieces):
    from cotsdl.nn.layout import interior_pieces

    inner = Box((lo0, lo1), (lo0 + rows, lo1 + cols))
    got = interior_pieces(inner, pieces)
    assert len(got) == (min(pieces, rows) if rows else 0)
    assert sum(b.size for b in got) == inner.size and all(not b.is_empty for b in got)
    assert all(b.lo[1] == lo1 and b.hi[1] == lo1 + cols for b in got)  # whole rows
    assert [b.lo[0] for b in got] == sorted(b.lo[0] for b in got)
    assert all(a.hi[0] == b.lo[0] for a, b in zip(got, got[1:]))  # in order, no gap, no overlap
    if got:
        assert got[0].lo[0] == lo0 and got[-1].hi[0] == lo0 + rows


@st.composite
def stages(draw):
    """One stage (filter -> pool -> LCN) on a random input, grid and rank."""
    from cotsdl.nn.layers import LCN
    from cotsdl.nn.network import Network, Stage

    pr = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    ps = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    stage = Stage(LocalFilter((draw(st.integers(1, 3)),) * 2, (1, 1), 2), L2Pool(pr, ps, 0.1),
                  LCN(draw(st.sampled_from([1, 3, 5])), 1.0))
    H, W = draw(st.integers(8, 30)), draw(st.integers(8, 30))
    net = Network((H, W, 1), [stage])
    dims = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    return net, dims


@settings(max_examples=300, deadline=None)
@given(stages())
def test_a_fused_pool_pools_every_pixel_its_lcn_reads_and_tiles_the_ranks(case):
    """The grown pool: the same layer and owned input, an output box that is exactly the LCN's window,
    sites and window that contain the per-layer ones; and over all ranks the LCN windows are covered."""
    from cotsdl.nn.layout import fused_pool, fuse_rows, layout

    net, dims = case
    for i in range(dims[0]):
        for j in range(dims[1]):
            rows = layout(net, dims, (i, j), 2)[1]
            pool, lcn = rows[1], rows[2]
            grown = fused_pool(pool, lcn)
            assert fuse_rows(rows, [0], net.roles)[1] == grown and fuse_rows(rows, [], net.roles) == rows
            assert (grown.index, grown.layer, grown.src_owned, grown.in_shape) == (
                pool.index, pool.layer, pool.src_owned, pool.in_shape)
            if lcn.out.is_empty:
                assert grown == pool
                continue
            assert grown.out == lcn.window and grown.out.contains(pool.out)
            assert grown.sites.contains(pool.sites) and grown.window.contains(pool.window)
            assert grown.window == pool.layer.rf.input_box(grown.out, pool.in_shape)
            assert Box((0, 0, 0, 0), pool.in_shape).contains(grown.window)
