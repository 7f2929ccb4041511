"""``cotsdl bench layers``: speed of the operations against the same run's ceiling.

Per shape: GFLOP/s of the filter's forward, backward-data and backward-weights
products as a fraction of the ceiling, and GB/s of L2 pooling and LCN (forward and
backward) on the filter's output, by the minimum bytes of :mod:`cotsdl.ops.costs`.

- ``--backend numpy``: the ceiling is numpy's float32 2048^3 sgemm on all cores,
  measured in the same run.  ``--peer`` adds the PyTorch formulations (unfold + per-site
  ``bmm`` / ``fold``; L2 pooling as the square root of an average pool of squares; LCN as
  a zero-padded Gaussian ``conv2d`` renormalized at the borders, its backward written
  out), eager and ``torch.compile``'d, and JAX's ``conv_general_dilated_local`` (jit,
  backward passes by ``jax.vjp``) for the filter; each is checked to compute our
  function on the shape first (allclose; one that disagrees is reported, not timed).
- ``--backend cuda``: CuPy arrays on the GPU; the ceilings are the device's fp32 peak
  (SMs x FP32 lanes x 2 x clock, from the device properties) and cuBLAS sgemm 8192^3
  measured in the same run; the paper-sized layer (200x200x3 input, 18x18 fields,
  stride 2, blocks of 4x4x8 neurons, N = 96) is added.
- ``--backend cuda-emu``: one tiny shape through the emulated kernels (it proves the
  path; the numbers mean nothing).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .. import backend, ops
from ..array.rfmap import sites
from ..ops import costs
from ..ops.lcn import gaussian as _gaussian


@dataclass(frozen=True)
class Shape:
    name: str
    H: int
    C: int
    r: int
    s: int
    K: int
    N: int
    block: tuple[int, int] = (1, 1)

    @property
    def sites(self) -> int:
        return sites(self.H, self.r, self.s)


PAPER = Shape("paper", 200, 3, 18, 2, 8, 96, (4, 4))
TINY = Shape("emu-tiny", 12, 2, 4, 2, 4, 8, (1, 2))
SHAPES = [
    Shape("A", 32, 8, 8, 4, 16, 64),
    Shape("B", 64, 3, 16, 8, 32, 32),
    Shape("C", 20, 16, 6, 2, 32, 128),
    Shape("D-blocks", 48, 3, 12, 4, 8, 64, (2, 2)),
]
POOL = dict(size=(2, 2), stride=(1, 1), eps=0.01)
LCN = dict(size=5, sigma=1.0, eps=1e-4)


def _no_sync() -> None:
    return None


def best_time(fn: Callable[[], Any], repeats: int, min_time: float = 0.0, sync: Callable[[], None] = _no_sync) -> float:
    """Minimum wall time of ``fn`` over ``repeats`` calls (after one warm-up call); ``sync``
    waits for queued device work before a clock is read."""
    fn()
    sync()
    best, spent, n = float("inf"), 0.0, 0
    while n < repeats or spent < min_time:
        t0 = time.perf_counter()
        fn()
        sync()
        dt = time.perf_counter() - t0
        best, spent, n = min(best, dt), spent + dt, n + 1
    return best


def sgemm_ceiling(n: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of a float32 n x n matmul with numpy's BLAS on all its threads."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    return 2.0 * n ** 3 / best_time(lambda: a @ b, repeats) / 1e9


def device_ceilings(repeats: int = 5) -> dict[str, float]:
    """fp32 peak and memory bandwidth of the current GPU (device properties) and a measured cuBLAS sgemm."""
    cupy = backend.cupy_module()

    rt, dev = cupy.cuda.runtime, cupy.cuda.Device().id
    # Attributes, not getDeviceProperties: CUDA 13 dropped the clock fields from cudaDeviceProp.
    attr = lambda a: rt.deviceGetAttribute(a, dev)  # noqa: E731
    sms, clock_khz, mem_khz, bus_bits = attr(16), attr(13), attr(36), attr(37)
    major, minor = attr(75), attr(76)
    lanes = {7: 64, 8: 64 if minor == 0 else 128}.get(major, 128)  # FP32 lanes per SM
    peak = sms * lanes * 2 * clock_khz * 1e3 / 1e9
    bw = 2 * mem_khz * 1e3 * bus_bits / 8 / 1e9
    name = rt.getDeviceProperties(dev)["name"]
    n = 8192
    a = cupy.random.standard_normal((n, n), dtype=cupy.float32)
    sync = cupy.cuda.get_current_stream().synchronize
    gemm = 2.0 * n ** 3 / best_time(lambda: a @ a, repeats, sync=sync) / 1e9
    if not peak > 0 or not bw > 0:
        raise RuntimeError(f"cannot read the GPU's clock rates (peak {peak} GFLOP/s, bandwidth {bw} GB/s)")
    return {"name": name.decode() if isinstance(name, bytes) else str(name), "compute_capability": f"{major}.{minor}",
            "fp32_peak_GFLOPs": peak, "memory_GBps": bw, "cublas_sgemm_GFLOPs": gemm}

# -- peers (--peer): the same functions in PyTorch (eager and torch.compile'd) and JAX -------------


def _sites_order(y: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """Our filter output (SH*bh, SW*bw, K, N) -> (SH, SW, M, N), the per-site order the peers produce."""
    H, W, K, N = y.shape
    bh, bw = block
    return y.reshape(H // bh, bh, W // bw, bw, K, N).transpose(0, 2, 1, 3, 4, 5).reshape(H // bh, W // bw, -1, N)


def _agree(got: np.ndarray, want: np.ndarray) -> tuple[bool, float]:
    """Same function: allclose at float32 accuracy, scaled by the size of the values; and the relative error."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return False, float("inf")
    scale = float(np.abs(want).max()) or 1.0
    err = float(np.abs(got - want).max()) / scale
    return bool(np.isfinite(err) and np.allclose(got, want, rtol=1e-3, atol=2e-4 * scale)), err


def _torch_formulations(sh: Shape, data: dict[str, np.ndarray]) -> tuple[dict[str, tuple], Callable] | None:
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

    yt, pt, dpt, dyt = nchw(data["y"]), nchw(data["p"]), nchw(data["dp"]), nchw(dy)
    dyst = dys.transpose(1, 2).contiguous()  # (S, N, M)
    forms = {
        "filter_forward": (fwd, (xt, wt), lambda o: o.detach().numpy().reshape(SH, SW, -1, M).transpose(0, 1, 3, 2)),
        "filter_bwd_data": (bwd_data, (dyst, wt), back),
        "filter_bwd_weights": (bwd_weights, (xt, dys),
                               lambda o: o.detach().numpy().reshape(SH, SW, M, C, r, r).transpose(0, 1, 2, 4, 5, 3)),
        "pool_forward": (pool_fwd, (yt,), back),
        "pool_backward": (pool_bwd, (dpt, yt, pt), back),
        "lcn_forward": (lcn_fwd, (yt,), back),
        "lcn_backward": (lcn_bwd, (dyt, yt), back),
    }
    return forms, lambda f: torch.compile(f, dynamic=False)


def _jax_formulations(sh: Shape, data: dict[str, np.ndarray]) -> dict[str, tuple] | None:
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


def _ours_for_peers(name: str, result: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """Our result in the layout the peers' converters give back."""
    return _sites_order(result, block) if name == "filter_forward" else result


def peer_times(sh: Shape, data: dict[str, np.ndarray], ours: dict[str, np.ndarray], repeats: int,
               min_time: float) -> dict[str, dict[str, dict[str, Any]]]:
    """Per pass and peer: whether it computes our function on this shape, and its time when it does.

    A peer whose result is not allclose to ours is reported (``agrees: False``, its error) and not timed.
    """
    found: dict[str, dict[str, tuple]] = {}
    torch_forms = _torch_formulations(sh, data)
    if torch_forms is not None:
        forms, compile_ = torch_forms
        found["torch"] = forms
        found["torch-compile"] = {k: (compile_(fn), a, conv) for k, (fn, a, conv) in forms.items()}
    jax_forms = _jax_formulations(sh, data)
    if jax_forms is not None:
        found["jax"] = jax_forms
    res: dict[str, dict[str, dict[str, Any]]] = {}
    for peer, forms in found.items():
        for name, (fn, args, conv) in forms.items():
            try:
                got = conv(fn(*args))
            except Exception as e:  # noqa: BLE001 - a peer that fails is reported, the bench goes on
                res.setdefault(name, {})[peer] = {"agrees": False, "error": f"{type(e).__name__}: {e}"[:300]}
                continue
            ok, err = _agree(got, _ours_for_peers(name, ours[name], sh.block))
            rec: dict[str, Any] = {"agrees": ok, "max_rel_error": err}
            if ok:
                t0 = time.perf_counter()
                fn(*args)
                once = time.perf_counter() - t0
                # A peer slower than a second per call is timed once: it is not close to level anyway.
                rec["seconds"] = once if once > 1.0 else best_time(lambda: fn(*args), repeats, min_time=min_time)
            res.setdefault(name, {})[peer] = rec
    return res


def peers_importable() -> list[str]:
    """The peers whose libraries import here."""
    have = []
    for mod, names in (("torch", ["torch", "torch-compile"]), ("jax", ["jax"])):
        try:
            __import__(mod)
        except ImportError:
            continue
        have += names
    return have


def run(repeats: int = 10, dtype: Any = np.float32, log=sys.stdout, min_time: float = 0.2,
        backend_name: str = "numpy", peer: bool = False, shapes: list[Shape] | None = None) -> dict[str, Any]:
    """Measure every shape (``shapes``, default the backend's list); print a table; return the numbers.

    ``peer``: on the numpy backend also run the PyTorch (eager, compiled) and JAX formulations that import,
    each checked first to compute our function on the shape; ``ratio`` = peer time / our time (> 1: ours faster).
    """
    dtype = np.dtype(dtype)
    item = dtype.itemsize
    say = lambda *a: print(*a, file=log, flush=True)  # noqa: E731
    xp, sync, default_shapes, dev = np, _no_sync, SHAPES, None
    if backend_name == "cuda":
        cupy = backend.cupy_module()
        xp, sync, default_shapes = cupy, cupy.cuda.get_current_stream().synchronize, SHAPES + [PAPER]
        dev = device_ceilings()
        ceiling = dev["fp32_peak_GFLOPs"]
    elif backend_name == "cuda-emu":
        default_shapes, ceiling = [TINY], sgemm_ceiling()
    else:
        ceiling = sgemm_ceiling()
    shapes = default_shapes if shapes is None else list(shapes)
    peers: list[str] = []
    if peer and backend_name != "numpy":
        say(f"(--peer compares the numpy backend only; ignored with --backend {backend_name})")
    elif peer:
        peers = peers_importable()
        if not peers:
            say("(--peer: neither PyTorch nor JAX is importable; no peers run. pip install -e .[bench])")
        elif "jax" not in peers:
            say("(--peer: JAX is not importable; PyTorch peers only)")
        elif "torch" not in peers:
            say("(--peer: PyTorch is not importable; JAX peer only)")
    out: dict[str, Any] = {"benchmark": "layers", "backend": backend_name, "dtype": dtype.name,
                           "threads": ops.num_threads(), "sgemm_2048_GFLOPs": None if dev else ceiling,
                           "device": dev, "peers": peers if peer else None, "results": []}
    if dev:
        say(f"cotsdl bench layers: cuda, {dev['name']}, {dtype.name}; fp32 peak {dev['fp32_peak_GFLOPs'] / 1e3:.1f} "
            f"TFLOP/s, memory {dev['memory_GBps']:.0f} GB/s (device properties); cuBLAS sgemm 8192^3 "
            f"{dev['cublas_sgemm_GFLOPs'] / 1e3:.1f} TFLOP/s (same run)")
    else:
        say(f"cotsdl bench layers: {backend_name}, {dtype.name}, {ops.num_threads()} thread(s); "
            f"sgemm 2048^3 ceiling {ceiling:.1f} GFLOP/s (same run)")
    peer_head = "".join(f" {'/' + p:>14}" for p in peers)
    say(f"{'shape':9} {'op':18} {'ms':>9} {'GFLOP/s':>9} {'of sgemm' if dev is None else 'of peak':>9} {'GB/s':>8}"
        + peer_head)
    if peers:
        say(f"{'':48}(peer time / ours, peer ms: ratio > 1 means ours is faster; '≠': disagrees, not timed)")
    for sh in shapes:
        rng = np.random.default_rng(0)
        x = xp.asarray(rng.standard_normal((sh.H, sh.H, sh.C, sh.N)).astype(dtype))
        M = sh.block[0] * sh.block[1] * sh.K
        w = xp.asarray((rng.standard_normal((sh.sites, sh.sites, M, sh.r, sh.r, sh.C), dtype=np.float32) / sh.r).astype(dtype))
        size, stride = (sh.r, sh.r), (sh.s, sh.s)
        y = ops.local_filter(x, w, stride, sh.block)
        dy = xp.asarray(rng.standard_normal(y.shape).astype(dtype))
        fc = costs.local_filter(sh.H, sh.H, sh.C, sh.N, size, stride, sh.block, sh.K, item)
        p = ops.l2_pool(y, **POOL)
        dp = xp.ones_like(p)
        pc = costs.l2_pool(*y.shape, POOL["size"], POOL["stride"], item)
        lc = costs.lcn(*y.shape, LCN["size"], item)
        runs = {
            "filter_forward": (lambda: ops.local_filter(x, w, stride, sh.block), fc["forward"]),
            "filter_bwd_data": (lambda: ops.local_filter_backward_data(dy, w, stride, sh.block, input_shape=x.shape),
                                fc["backward_data"]),
            "filter_bwd_weights": (lambda: ops.local_filter_backward_weights(x, dy, size, stride, sh.block),
                                   fc["backward_weights"]),
            "pool_forward": (lambda: ops.l2_pool(y, **POOL), pc["forward"]),
            "pool_backward": (lambda: ops.l2_pool_backward(dp, y, p, POOL["size"], POOL["stride"]), pc["backward"]),
            "lcn_forward": (lambda: ops.lcn(y, **LCN), lc["forward"]),
            "lcn_backward": (lambda: ops.lcn_backward(dy, y, **LCN), lc["backward"]),
        }
        row: dict[str, Any] = {"shape": sh.name, "H": sh.H, "W": sh.H, "C": sh.C, "r": sh.r, "s": sh.s, "K": sh.K,
                               "N": sh.N, "block": list(sh.block), "ops": {}}
        fkey = "fraction_of_sgemm" if dev is None else "fraction_of_peak"
        for name, (fn, cost) in runs.items():
            t = best_time(fn, repeats, min_time=min_time, sync=sync)
            rec = {"seconds": t, "GFLOPs": cost.flops / t / 1e9, "GBps": cost.bytes / t / 1e9}
            if name.startswith("filter"):
                rec[fkey] = rec["GFLOPs"] / ceiling
            elif dev is not None:
                rec["fraction_of_bandwidth"] = rec["GBps"] / dev["memory_GBps"]
            row["ops"][name] = rec
        # The peers after ours: their thread pools must not run beside our timings.
        cmp = peer_times(sh, {"x": x, "w": w, "dy": dy, "y": y, "p": p, "dp": dp},
                         {name: fn() for name, (fn, _) in runs.items()}, repeats, min_time) if peers else {}
        for name, rec in row["ops"].items():
            t, cells = rec["seconds"], []
            if peers:
                rec["peers"] = cmp.get(name, {})
                for pname in peers:
                    pr = rec["peers"].get(pname)
                    if pr is None:
                        cells.append(f"{'-':>15}")
                    elif not pr["agrees"]:
                        cells.append(f"{'≠':>15}")
                    else:
                        pr["ratio"] = pr["seconds"] / t
                        cells.append(f" {pr['ratio']:6.2f} ({pr['seconds'] * 1e3:.2g})".rjust(15))
            frac = f"{rec[fkey]:9.2f}" if fkey in rec else f"{'':9}"
            gbs = f"{rec['GBps']:8.2f}" if not name.startswith("filter") else f"{'':8}"
            say(f"{sh.name:9} {name:18} {t * 1e3:9.3f} {rec['GFLOPs']:9.1f} {frac} {gbs}" + "".join(cells))
        out["results"].append(row)
    for row in out["results"]:
        for name, rec in row["ops"].items():
            for pname, pr in rec.get("peers", {}).items():
                if not pr["agrees"]:
                    say(f"peer {pname} disagrees on {row['shape']} {name}: "
                        + (pr.get("error") or f"max relative error {pr['max_rel_error']:.2e}"))
    return out
