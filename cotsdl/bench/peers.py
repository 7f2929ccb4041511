"""The peers of ``cotsdl bench layers --peer``: our functions written in PyTorch and JAX.

PyTorch: unfold + per-site ``bmm`` / ``fold`` for the filter; L2 pooling as the square
root of an average pool of squares; LCN as a zero-padded Gaussian ``conv2d``
renormalized at the borders, its backward written out; each eager and
``torch.compile``'d.  JAX: ``conv_general_dilated_local`` (jit; backward passes by
``jax.vjp``) for the filter.  Each is checked to compute our function on the shape
first (allclose); one that disagrees is reported, not timed.

:func:`quiet_idle_threads` is called before either library is imported: their idle
worker threads must wait passively, or they steal the cores of whatever is timed next
(cotsdl's backward-weights ran 3x slower right after torch with spinning OpenMP threads).
"""
from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from .. import ops
from ..ops.lcn import gaussian as _gaussian

POOL = dict(size=(2, 2), stride=(1, 1), eps=0.01)
LCN = dict(size=5, sigma=1.0, eps=1e-4)
TRAIN_LAM = 0.1  # the sparsity weight of the benchmarked training step


def quiet_idle_threads() -> None:
    """Idle OpenMP workers sleep instead of spinning (set before torch/JAX start their pools)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("GOMP_SPINCOUNT", "0")
    os.environ.setdefault("KMP_BLOCKTIME", "0")


def _sites_order(y: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """Our filter output (SH*bh, SW*bw, K, N) -> (SH, SW, M, N), the per-site order the peers produce."""
    H, W, K, N = y.shape
    bh, bw = block
    return y.reshape(H // bh, bh, W // bw, bw, K, N).transpose(0, 2, 1, 3, 4, 5).reshape(H // bh, W // bw, -1, N)


#: Passes through a non-differentiable point, and the share of elements allowed to differ there.
#: LCN's max(s, m, eps): where a pixel's local s and the image mean m agree to float32 rounding,
#: the two sides may take different branches (both are valid subgradients).  On P-paper one such
#: pixel changes its 9x9 x C footprint, about 1e-4 of the elements (float64 shows no difference).
KINKS = {"lcn_backward": 1e-3}


def _agree(got: np.ndarray, want: np.ndarray, stray: float = 0.0) -> tuple[bool, float]:
    """Same function: allclose at float32 accuracy, scaled by the size of the values, on all but a
    ``stray`` share of the elements; and the relative error over all of them."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return False, float("inf")
    scale = float(np.abs(want).max()) or 1.0
    err = float(np.abs(got - want).max()) / scale
    off = np.count_nonzero(~np.isclose(got, want, rtol=1e-3, atol=2e-4 * scale))
    return bool(np.isfinite(err) and off <= stray * got.size), err


def _torch_formulations(sh: Any, data: dict[str, np.ndarray]) -> tuple[dict[str, tuple], Callable] | None:
    """Per pass: (function, arguments, converter of its result to our layout); None when torch does not import."""
    try:
        import torch  # noqa: PLC0415
        import torch.nn.functional as F  # noqa: N812, PLC0415
    except ImportError:
        return None
    torch.set_num_threads(ops.num_threads())
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    nchw = lambda a: t(a.transpose(3, 2, 0, 1))  # noqa: E731  (H, W, C, N) -> (N, C, H, W)
    back = lambda r: r.detach().numpy().transpose(2, 3, 1, 0)  # noqa: E731  (N, C, H, W) -> (H, W, C, N)
    x, w, dy = data["x"], data["w"], data["dy"]
    SH, SW, M = w.shape[:3]
    S, r, s = SH * SW, sh.r, sh.s
    H, C = sh.H, sh.C
    # unfold's patch order is (c, p, q); the weights follow it.
    wt = t(w.transpose(0, 1, 2, 5, 3, 4).reshape(S, M, -1))
    xt = nchw(x)
    dys = t(_sites_order(dy, sh.block).reshape(S, M, -1))

    def patches(xt):  # (S, N, R): Tensor.unfold views, one copy; faster than F.unfold's (N, R, S) in bmm
        return xt.unfold(2, r, s).unfold(3, r, s).permute(2, 3, 0, 1, 4, 5).reshape(S, xt.shape[0], -1)

    def fwd(xt, wt):
        return torch.bmm(patches(xt), wt.transpose(1, 2))  # (S, N, M)

    def bwd_data(dyst, wt):
        cols = torch.bmm(dyst, wt)  # (S, N, R)
        return F.fold(cols.permute(1, 2, 0).contiguous(), (H, H), r, stride=s)  # (N, C, H, W)

    def bwd_weights(xt, dys):
        return torch.bmm(dys, patches(xt))  # (S, M, R)

    ps, pst, eps = POOL["size"], POOL["stride"], POOL["eps"]
    area = ps[0] * ps[1]

    def pool_fwd(a):
        return torch.sqrt(F.avg_pool2d(a * a, ps, pst) * area + eps)

    def pool_bwd(g, a, b):
        spread = torch.ops.aten.avg_pool2d_backward(torch.where(b > 0, g / b, 0), a, ps, pst, [0, 0], False, True, 1)
        return spread * a

    # LCN: the Gaussian as one (2 rho + 1)^2 convolution, zero-padded, renormalized by Z at the borders.
    size, sigma, leps = LCN["size"], LCN["sigma"], LCN["eps"]
    rho = size // 2
    g1 = _gaussian(size, sigma)
    Hy, Wy, Cy = data["y"].shape[:3]
    g2 = t(np.outer(g1, g1).astype(np.float32)[None, None])
    z = F.conv2d(torch.ones(1, 1, Hy, Wy), g2, padding=rho)

    def smooth(u):  # (N, 1, H, W)
        return F.conv2d(u, g2, padding=rho) / z

    def smooth_t(u):  # adjoint of smooth: the zero-padded convolution with a symmetric g is self-adjoint
        return F.conv2d(u / z, g2, padding=rho)

    def lcn_parts(a):
        v = a - smooth(a.mean(1, keepdim=True))
        sd = torch.sqrt(smooth((v * v).mean(1, keepdim=True)))
        m = sd.mean((2, 3), keepdim=True)
        return v, sd, m, torch.clamp(torch.maximum(sd, m), min=leps)

    def lcn_fwd(a):
        v, _, _, d = lcn_parts(a)
        return v / d

    def lcn_bwd(g, a):  # the forward recomputed, as ours does
        v, sd, m, d = lcn_parts(a)
        dd = -(g * v).sum(1, keepdim=True) / (d * d)
        s_wins = (sd >= m) & (sd >= leps)
        m_wins = ~s_wins & (m >= leps)
        ds = torch.where(s_wins, dd, 0) + torch.where(m_wins, dd, 0).sum((2, 3), keepdim=True) / (Hy * Wy)
        du = torch.where(sd > 0, ds / (2 * sd), 0)
        dv = g / d + (2.0 / Cy) * v * smooth_t(du)
        return dv - smooth_t(dv.sum(1, keepdim=True)) / Cy

    # One training step of the stage's sparse autoencoder (tied weights; objective.py):
    # J = (||F^T F x - x||^2 + lam * sum P(F x)) / N and dJ/dw, by autograd.
    bh, bw = sh.block
    K = M // (bh * bw)
    N = x.shape[3]

    def loss(xt, wt):
        hs = fwd(xt, wt)  # (S, N, M)
        xhat = bwd_data(hs, wt)
        hh = hs.reshape(SH, SW, N, bh, bw, K).permute(2, 5, 0, 3, 1, 4).reshape(N, K, SH * bh, SW * bw)
        rec = xhat - xt
        return ((rec * rec).sum() + TRAIN_LAM * pool_fwd(hh).sum()) / N

    def train_with(loss_fn):
        def train(xt, wt):
            wg = wt.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(loss_fn(xt, wg), wg)
            return g
        return train

    def w_back(o):  # (S, M, (c, p, q)) -> our (SH, SW, M, rh, rw, C)
        return o.detach().numpy().reshape(SH, SW, M, C, r, r).transpose(0, 1, 2, 4, 5, 3)

    yt, pt, dpt, dyt = nchw(data["y"]), nchw(data["p"]), nchw(data["dp"]), nchw(dy)
    dyst = dys.transpose(1, 2).contiguous()  # (S, N, M)
    forms = {
        "filter_forward": (fwd, (xt, wt), lambda o: o.detach().numpy().reshape(SH, SW, -1, M).transpose(0, 1, 3, 2)),
        "filter_bwd_data": (bwd_data, (dyst, wt), back),
        "filter_bwd_weights": (bwd_weights, (xt, dys), w_back),
        "pool_forward": (pool_fwd, (yt,), back),
        "pool_backward": (pool_bwd, (dpt, yt, pt), back),
        "lcn_forward": (lcn_fwd, (yt,), back),
        "lcn_backward": (lcn_bwd, (dyt, yt), back),
        "train_step": (train_with(loss), (xt, wt), w_back),
    }

    def compile_(name, fn):  # the step: its loss compiled (forward and backward graphs), autograd outside
        return train_with(torch.compile(loss, dynamic=False)) if name == "train_step" else torch.compile(fn, dynamic=False)

    return forms, compile_


def _jax_formulations(sh: Any, data: dict[str, np.ndarray]) -> dict[str, tuple] | None:
    """The filter's passes with ``jax.lax.conv_general_dilated_local`` (jit; the backward passes by ``jax.vjp``)."""
    try:
        import jax  # noqa: PLC0415
    except ImportError:
        return None
    x, w, dy = data["x"], data["w"], data["dy"]
    SH, SW, M = w.shape[:3]
    r, s, C = sh.r, sh.s, sh.C
    put = lambda a: jax.device_put(np.ascontiguousarray(a))  # noqa: E731
    xj = put(x.transpose(3, 2, 0, 1))  # (N, C, H, W)
    wj = put(w.transpose(2, 5, 3, 4, 0, 1).reshape(M, C * r * r, SH, SW))  # (O, I = (c, p, q), SH, SW)
    dyj = put(_sites_order(dy, sh.block).transpose(3, 2, 0, 1))  # (N, M, SH, SW)

    def f(a, b):
        return jax.lax.conv_general_dilated_local(a, b, (s, s), "VALID", (r, r),
                                                  dimension_numbers=("NCHW", "OIHW", "NCHW"))

    fwd = jax.jit(f)
    bwd_data = jax.jit(lambda g, b: jax.vjp(lambda a: f(a, b), xj)[1](g)[0])
    bwd_weights = jax.jit(lambda a, g: jax.vjp(lambda b: f(a, b), wj)[1](g)[0])
    ready = lambda fn: (lambda *a: fn(*a).block_until_ready())  # noqa: E731
    return {
        "filter_forward": (ready(fwd), (xj, wj), lambda o: np.asarray(o).transpose(2, 3, 1, 0)),
        "filter_bwd_data": (ready(bwd_data), (dyj, wj), lambda o: np.asarray(o).transpose(2, 3, 1, 0)),
        "filter_bwd_weights": (ready(bwd_weights), (xj, dyj),
                               lambda o: np.asarray(o).reshape(M, C, r, r, SH, SW).transpose(4, 5, 0, 2, 3, 1)),
    }


def _ours_for_peers(name: str, result: Any, block: tuple[int, int]) -> np.ndarray:
    """Our result in the layout the peers' converters give back (the training step: its weight gradient)."""
    if name == "train_step":
        return result[1]
    return _sites_order(result, block) if name == "filter_forward" else result


def peer_callables(sh, data: dict[str, np.ndarray], ours: dict[str, np.ndarray]) -> dict[str, dict[str, tuple]]:
    """Per pass and peer: (record, callable or None).  The record says whether the peer computes our
    function on this shape (``agrees``, ``max_rel_error`` or ``error``); only one that agrees is timed."""
    found: dict[str, dict[str, tuple]] = {}
    torch_forms = _torch_formulations(sh, data)
    if torch_forms is not None:
        forms, compile_ = torch_forms
        found["torch"] = forms
        found["torch-compile"] = {k: (compile_(k, fn), a, conv) for k, (fn, a, conv) in forms.items()}
    jax_forms = _jax_formulations(sh, data)
    if jax_forms is not None:
        found["jax"] = jax_forms
    res: dict[str, dict[str, tuple]] = {}
    for peer, forms in found.items():
        for name, (fn, args, conv) in forms.items():
            try:
                got = conv(fn(*args))
            except Exception as e:  # noqa: BLE001 - a peer that fails is reported, the bench goes on
                res.setdefault(name, {})[peer] = ({"agrees": False, "error": f"{type(e).__name__}: {e}"[:300]}, None)
                continue
            ok, err = _agree(got, _ours_for_peers(name, ours[name], sh.block), KINKS.get(name, 0.0))
            call = (lambda fn=fn, args=args: fn(*args)) if ok else None
            res.setdefault(name, {})[peer] = ({"agrees": ok, "max_rel_error": err}, call)
    return res


def peers_importable() -> list[str]:
    """The peers whose libraries import here."""
    quiet_idle_threads()
    have = []
    for mod, names in (("torch", ["torch", "torch-compile"]), ("jax", ["jax"])):
        try:
            __import__(mod)
        except ImportError:
            continue
        have += names
    return have


