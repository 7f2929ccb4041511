"""``cotsdl bench layers``: speed of the numpy backend's operations against the machine's sgemm.

Per shape: GFLOP/s of the filter's forward, backward-data and backward-weights
products as a fraction of the same run's sgemm ceiling (numpy float32 2048x2048,
all cores), and GB/s of L2 pooling and LCN (forward and backward) on the filter's
output, by the minimum bytes of :mod:`cotsdl.ops.costs`.  When PyTorch imports, the
usual PyTorch formulation (unfold + per-site batched matmul; ``lp_pool2d``) runs on
the same data as a peer.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .. import ops
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
        return (self.H - self.r) // self.s + 1


SHAPES = [
    Shape("A", 32, 8, 8, 4, 16, 64),
    Shape("B", 64, 3, 16, 8, 32, 32),
    Shape("C", 20, 16, 6, 2, 32, 128),
    Shape("D-blocks", 48, 3, 12, 4, 8, 64, (2, 2)),
]
POOL = dict(size=(2, 2), stride=(1, 1), eps=0.01)
LCN = dict(size=5, sigma=1.0, eps=1e-4)


def best_time(fn: Callable[[], Any], repeats: int, min_time: float = 0.0) -> float:
    """Minimum wall time of ``fn`` over ``repeats`` calls (after one warm-up call)."""
    fn()
    best, spent, n = float("inf"), 0.0, 0
    while n < repeats or spent < min_time:
        t0 = time.perf_counter()
        fn()
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


def run(repeats: int = 10, dtype: Any = np.float32, log=sys.stdout, min_time: float = 0.2) -> dict[str, Any]:
    """Measure every shape; print a table; return the numbers."""
    dtype = np.dtype(dtype)
    item = dtype.itemsize
    say = lambda *a: print(*a, file=log, flush=True)  # noqa: E731
    ceiling = sgemm_ceiling()
    out: dict[str, Any] = {"benchmark": "layers", "dtype": dtype.name, "threads": ops.num_threads(),
                           "sgemm_2048_GFLOPs": ceiling, "results": []}
    say(f"cotsdl bench layers: {dtype.name}, {ops.num_threads()} thread(s); "
        f"sgemm 2048^3 ceiling {ceiling:.1f} GFLOP/s (same run)")
    say(f"{'shape':9} {'op':18} {'ms':>9} {'GFLOP/s':>9} {'of sgemm':>9} {'GB/s':>8} {'torch ms':>9}")
    for sh in SHAPES:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((sh.H, sh.H, sh.C, sh.N)).astype(dtype)
        M = sh.block[0] * sh.block[1] * sh.K
        w = (rng.standard_normal((sh.sites, sh.sites, M, sh.r, sh.r, sh.C)) / sh.r).astype(dtype)
        size, stride = (sh.r, sh.r), (sh.s, sh.s)
        y = ops.local_filter(x, w, stride, sh.block)
        dy = rng.standard_normal(y.shape).astype(dtype)
        fc = costs.local_filter(sh.H, sh.H, sh.C, sh.N, size, stride, sh.block, sh.K, item)
        p = ops.l2_pool(y, **POOL)
        dp = np.ones_like(p)
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
        peer = _torch_peer(x, w, sh, y, repeats)
        row: dict[str, Any] = {"shape": sh.name, "H": sh.H, "W": sh.H, "C": sh.C, "r": sh.r, "s": sh.s, "K": sh.K,
                               "N": sh.N, "block": list(sh.block), "ops": {}, "torch": peer}
        for name, (fn, cost) in runs.items():
            t = best_time(fn, repeats, min_time=min_time)
            rec = {"seconds": t, "GFLOPs": cost.flops / t / 1e9, "GBps": cost.bytes / t / 1e9}
            if name.startswith("filter"):
                rec["fraction_of_sgemm"] = rec["GFLOPs"] / ceiling
            row["ops"][name] = rec
            tp = peer.get(f"{name}_s") if peer else None
            frac = f"{rec['fraction_of_sgemm']:9.2f}" if "fraction_of_sgemm" in rec else f"{'':9}"
            gbs = f"{rec['GBps']:8.2f}" if not name.startswith("filter") else f"{'':8}"
            say(f"{sh.name:9} {name:18} {t * 1e3:9.3f} {rec['GFLOPs']:9.1f} {frac} {gbs} "
                f"{(f'{tp * 1e3:9.3f}' if tp else f'{chr(45):>9}')}")
        out["results"].append(row)
    if not any(r["torch"] for r in out["results"]):
        say("(PyTorch is not importable: no peer column)")
    return out
