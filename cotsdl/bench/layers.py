"""``cotsdl bench layers``: speed of the operations against the same run's ceiling.

Per shape: GFLOP/s of the filter's forward, backward-data and backward-weights
products as a fraction of the ceiling, and GB/s of L2 pooling and LCN (forward and
backward) on the filter's output, by the minimum bytes of :mod:`cotsdl.ops.costs`.

- ``--backend numpy``: the ceiling is numpy's float32 2048^3 sgemm on all cores,
  measured in the same run; when PyTorch imports, the usual PyTorch formulation
  (unfold + per-site batched matmul; ``lp_pool2d``) runs on the same data as a peer.
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


def _torch_peer(x: np.ndarray, w: np.ndarray, shape: Shape, y_pool_in: np.ndarray, repeats: int) -> dict[str, float] | None:
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return None
    torch.set_num_threads(ops.num_threads())
    # PyTorch's layout is (N, C, H, W); unfold gives (N, C*r*r, S); per-site weights (S, M, C*r*r).
    xt = torch.from_numpy(np.ascontiguousarray(x.transpose(3, 2, 0, 1)))
    S = shape.sites * shape.sites
    M = w.shape[2]
    wt = torch.from_numpy(np.ascontiguousarray(w.transpose(0, 1, 2, 5, 3, 4).reshape(S, M, -1)))

    def fwd():
        cols = torch.nn.functional.unfold(xt, shape.r, stride=shape.s)  # (N, R, S)
        return torch.bmm(wt, cols.permute(2, 1, 0))  # (S, M, N)

    t = best_time(fwd, repeats)
    pt = torch.from_numpy(np.ascontiguousarray(y_pool_in.transpose(3, 2, 0, 1)))
    tp = best_time(lambda: torch.nn.functional.lp_pool2d(pt, 2, POOL["size"], stride=POOL["stride"]), repeats)
    return {"filter_forward_s": t, "pool_forward_s": tp}


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


def run(repeats: int = 10, dtype: Any = np.float32, log=sys.stdout, min_time: float = 0.2,
        backend_name: str = "numpy", peer: bool = False) -> dict[str, Any]:
    """Measure every shape; print a table; return the numbers."""
    dtype = np.dtype(dtype)
    item = dtype.itemsize
    say = lambda *a: print(*a, file=log, flush=True)  # noqa: E731
    xp, sync, shapes, dev = np, _no_sync, SHAPES, None
    if backend_name == "cuda":
        cupy = backend.cupy_module()
        xp, sync, shapes = cupy, cupy.cuda.get_current_stream().synchronize, SHAPES + [PAPER]
        dev = device_ceilings()
        ceiling = dev["fp32_peak_GFLOPs"]
    elif backend_name == "cuda-emu":
        shapes, ceiling = [TINY], sgemm_ceiling()
    else:
        ceiling = sgemm_ceiling()
    out: dict[str, Any] = {"benchmark": "layers", "backend": backend_name, "dtype": dtype.name,
                           "threads": ops.num_threads(), "sgemm_2048_GFLOPs": None if dev else ceiling,
                           "device": dev, "results": []}
    if dev:
        say(f"cotsdl bench layers: cuda, {dev['name']}, {dtype.name}; fp32 peak {dev['fp32_peak_GFLOPs'] / 1e3:.1f} "
            f"TFLOP/s, memory {dev['memory_GBps']:.0f} GB/s (device properties); cuBLAS sgemm 8192^3 "
            f"{dev['cublas_sgemm_GFLOPs'] / 1e3:.1f} TFLOP/s (same run)")
    else:
        say(f"cotsdl bench layers: {backend_name}, {dtype.name}, {ops.num_threads()} thread(s); "
            f"sgemm 2048^3 ceiling {ceiling:.1f} GFLOP/s (same run)")
    say(f"{'shape':9} {'op':18} {'ms':>9} {'GFLOP/s':>9} {'of sgemm' if dev is None else 'of peak':>9} {'GB/s':>8} {'torch ms':>9}")
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
        peer = _torch_peer(x, w, sh, y, repeats) if xp is np and backend_name == "numpy" else None
        row: dict[str, Any] = {"shape": sh.name, "H": sh.H, "W": sh.H, "C": sh.C, "r": sh.r, "s": sh.s, "K": sh.K,
                               "N": sh.N, "block": list(sh.block), "ops": {}, "torch": peer}
        for name, (fn, cost) in runs.items():
            t = best_time(fn, repeats, min_time=min_time, sync=sync)
            rec = {"seconds": t, "GFLOPs": cost.flops / t / 1e9, "GBps": cost.bytes / t / 1e9}
            if name.startswith("filter"):
                rec["fraction_of_sgemm" if dev is None else "fraction_of_peak"] = rec["GFLOPs"] / ceiling
            elif dev is not None:
                rec["fraction_of_bandwidth"] = rec["GBps"] / dev["memory_GBps"]
            row["ops"][name] = rec
            tp = peer.get(f"{name}_s") if peer else None
            fkey = "fraction_of_sgemm" if dev is None else "fraction_of_peak"
            frac = f"{rec[fkey]:9.2f}" if fkey in rec else f"{'':9}"
            gbs = f"{rec['GBps']:8.2f}" if not name.startswith("filter") else f"{'':8}"
            say(f"{sh.name:9} {name:18} {t * 1e3:9.3f} {rec['GFLOPs']:9.1f} {frac} {gbs} "
                f"{(f'{tp * 1e3:9.3f}' if tp else f'{chr(45):>9}')}")
        out["results"].append(row)
    if backend_name == "numpy" and not any(r["torch"] for r in out["results"]):
        say("(PyTorch is not importable: no peer column)")
    return out
