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


@st.composite
def filtered_stages(draw):
    """One stage with a random filter (size, stride, block) on a random input and grid."""
    from cotsdl.nn.layers import LCN
    from cotsdl.nn.network import Network, Stage

    fr = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    fs = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    fb = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    pr = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    ps = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    stage = Stage(LocalFilter(fr, fs, 2, fb), L2Pool(pr, ps, 0.1), LCN(draw(st.sampled_from([1, 3])), 1.0))
    H, W = draw(st.integers(10, 40)), draw(st.integers(10, 40))
    try:
        net = Network((H, W, 1), [stage])
    except ValueError:  # the stage does not fit this input
        net = Network((40, 40, 1), [Stage(LocalFilter(fr, (1, 1), 2, fb), L2Pool(pr, ps, 0.1), LCN(1, 1.0))])
    dims = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    return net, dims


@settings(max_examples=300, deadline=None)
@given(filtered_stages())
def test_a_fused_filter_writes_every_pixel_its_grown_pool_reads(case):
    """The grown filter: the same layer and owned input; the fewest whole sites whose output holds the
    grown pool's window; a window that is exactly what those sites read; inside the layer's sites;
    empty where the pool reads nothing.  fuse_rows grows it only with its pool."""
    import pytest

    from cotsdl.nn.layout import fuse_rows, fused_filter, fused_pool, layout

    net, dims = case
    filt0 = net.layers[0]
    bh, bw = filt0.unit_block
    for i in range(dims[0]):
        for j in range(dims[1]):
            rows = layout(net, dims, (i, j), 2)[1]
            filt, pool = rows[0], fused_pool(rows[1], rows[2])
            grown = fused_filter(filt, pool)
            fused = fuse_rows(rows, [0], net.roles, filters=[0])
            assert fused[0] == grown and fused[1] == pool and fused[2] == rows[2]
            assert fuse_rows(rows, [0], net.roles)[0] == filt
            assert (grown.index, grown.layer, grown.src_owned, grown.in_shape, grown.out_shape) == (
                filt.index, filt.layer, filt.src_owned, filt.in_shape, filt.out_shape)
            if pool.window.is_empty:
                assert grown.out.is_empty and grown.sites.is_empty and grown.window.is_empty
                continue
            assert grown.out.contains(pool.window)
            assert grown.out == site_output_box(filt0, grown.sites, filt.out_shape)
            # the fewest sites: dropping a first or last row or column of sites loses a pixel the pool reads
            w = pool.window
            assert grown.sites.lo == (w.lo[0] // bh, w.lo[1] // bw)
            assert grown.sites.hi == (-(-w.hi[0] // bh), -(-w.hi[1] // bw))
            assert Box((0, 0), filt0.sites(filt.in_shape)).contains(grown.sites)
            assert grown.window == filt0.rf.input_box(grown.out, filt.in_shape)
            assert Box((0, 0, 0, 0), filt.in_shape).contains(grown.window)
    with pytest.raises(ValueError, match="filter but not their pool"):
        fuse_rows(layout(net, dims, (0, 0), 2)[1], [], net.roles, filters=[0])
    with pytest.raises(ValueError, match="not a stage's filter and pool"):
        rows = layout(net, dims, (0, 0), 2)[1]
        fused_filter(rows[1], rows[2])
