"""``cotsdl bench layers``: speed of the operations against the same run's ceiling.

Per shape: GFLOP/s of the filter's forward, backward-data and backward-weights
products as a fraction of the ceiling, and GB/s of L2 pooling and LCN (forward and
backward) on the filter's output, by the minimum bytes of :mod:`cotsdl.ops.costs`.

- ``--backend numpy``: the four shapes below and the paper's layer on a 96x96x3 input
  (``P-paper``).  The ceiling is numpy's float32 2048^3 sgemm on all cores, measured in
  the same run at the start and again before each shape (the first included), the
  highest so far counting (a burst of load elsewhere during one measurement would
  otherwise flatter every fraction); each filter pass is also set beside its batched
  products alone (same operands already in the GEMM's layout, same threads: what BLAS
  gives these small per-site products).  ``--peer`` adds the formulations of
  :mod:`cotsdl.bench.peers` (PyTorch eager, with ``F.unfold`` and ``torch.compile``'d; JAX),
  checked first to compute our function;
  every contestant of a pass is timed in interleaved rounds, with idle OpenMP and BLAS
  threads told not to spin, and the best peer's ratio is printed per pass and shape.
- ``--backend cuda``: CuPy arrays on the GPU; the ceilings are the device's fp32 peak
  (SMs x FP32 lanes x 2 x clock, from the device properties) and cuBLAS sgemm 8192^3
  measured in the same run; the paper-sized layer (200x200x3 input, 18x18 fields,
  stride 2, blocks of 4x4x8 neurons, N = 96) is added.  Each filter pass is set beside
  its batched products alone in one cuBLAS strided-batched call (``cupy.matmul``), and
  the JSON gives its fraction of the measured cuBLAS sgemm too.  ``--peer`` runs the
  PyTorch formulations on the same GPU (:class:`cotsdl.bench.peers.PeerPlan`), every clock
  read after all the device's work is done (CuPy's stream and torch's); JAX is not run there.
- ``--backend cuda-emu``: one tiny shape through the emulated kernels (it proves the
  path; the numbers mean nothing); ``--peer`` runs the PyTorch and JAX peers on the CPU
  beside it, the device path's code on the host.

``--shapes P-185m`` (numpy, not a default: a minute and about 3 GB) is the first layer of
``jobs/configs/paper-185m.toml`` as one rank trains it: 200x200x3, blocks of 4x4x1, N = 96.
``--machine FILE|PRESET`` sets the run planner's prediction for that machine beside every pass
(:func:`cotsdl.planner.machine.op_seconds` for a rank running this run's threads; ``train_step``:
the sum of the step's passes), and the measured time over it: what ``cotsdl plan`` assumes of
each pass, next to what it takes here.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .. import backend, ops
from ..array.rfmap import sites
from ..nn.network import filter_pass_shape, lcn_pass_shape, pool_pass_shape
from ..ops import costs
from ..ops.cpu.parallel import chunk_bounds, run_ranges, single_threaded_blas
from ..train.objective import sparse_ae_loss
from .common import as_step
from .sampling import interleaved_best
from .peers import LCN, POOL, TRAIN_LAM, _agree, peer_callables, peers_importable  # noqa: F401 - _agree: tests
from .peers import plan as peer_plan



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
#: The paper's layer on a CPU-sized input: 96x96x3, 18x18 fields, stride 2, 4x4 blocks of 8 units
CPU_PAPER = Shape("P-paper", 96, 3, 18, 2, 8, 32, (4, 4))
#: The first layer of jobs/configs/paper-185m.toml on one rank: 200x200x3, 18x18 fields, stride 2, 4x4 blocks of
#: one unit, N = 96 (528 MB of weights; on request only, --shapes P-185m)
CPU_PAPER_185M = Shape("P-185m", 200, 3, 18, 2, 1, 96, (4, 4))
TINY = Shape("emu-tiny", 12, 2, 4, 2, 4, 8, (1, 2))
SHAPES = [
    Shape("A", 32, 8, 8, 4, 16, 64),
    Shape("B", 64, 3, 16, 8, 32, 32),
    Shape("C", 20, 16, 6, 2, 32, 128),
    Shape("D-blocks", 48, 3, 12, 4, 8, 64, (2, 2)),
]
NUMPY_SHAPES = SHAPES + [CPU_PAPER]
#: Shapes --shapes may name beyond the default ones, by backend
EXTRA_SHAPES = {"numpy": [CPU_PAPER_185M], "cuda": [CPU_PAPER_185M]}
#: The planner's op of each timed pass (planner.machine.EFFICIENCY_KEYS)
PLANNED = {"filter_forward": "filter_forward", "filter_bwd_data": "filter_backward_data",
           "filter_bwd_weights": "filter_backward_weights", "pool_forward": "pool_forward",
           "pool_backward": "pool_backward", "lcn_forward": "lcn_forward", "lcn_backward": "lcn_backward"}
#: Weights above this many bytes: no matmul-alone column (its gathered operands would be gigabytes)
ALONE_MAX_WEIGHT_BYTES = 256 << 20


def predicted(machine: dict[str, Any], name: str, cost: costs.Cost, fc: dict[str, costs.Cost],
              pc: dict[str, costs.Cost], shapes: dict[str, str] | None = None) -> float:
    """The planner's time of pass ``name`` (or of ``train_step``: two forwards, backward-data, backward-weights
    over both pairs of a tied autoencoder, pooling both ways) on ``machine`` for a rank running this
    process's threads (``shapes``: the layers' pass shapes by kind, as the planner looks efficiencies up)."""
    from ..planner.machine import op_seconds, rank_share  # noqa: PLC0415

    share = rank_share(machine, max(1, machine["device"]["cores"] // max(1, ops.num_threads())))
    one = lambda op, c, pairs=1: op_seconds(machine, share, op, c.flops * pairs, c.bytes * pairs,  # noqa: E731
                                            shape=(shapes or {}).get(op.split("_", 1)[0]))
    if name == "train_step":
        return (2 * one("filter_forward", fc["forward"]) + one("filter_backward_data", fc["backward_data"])
                + one("filter_backward_weights", fc["backward_weights"], 2) + one("pool_forward", pc["forward"])
                + one("pool_backward", pc["backward"]))
    return one(PLANNED[name], cost)


def _kept(result: Any) -> Any:
    """A host copy of a result, which outlives the next call (one step's lent memory is the next one's):
    the peers' agreement is checked on the host."""
    if isinstance(result, tuple):
        return tuple(_kept(r) for r in result)
    if backend.is_device_array(result):
        return backend.to_numpy(result)
    return result.copy() if hasattr(result, "copy") and hasattr(result, "shape") else result


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

def matmul_alone(name: str, x: Any, w: Any, dy: Any, sh: Shape) -> Callable[[], None]:
    """The filter pass's batched products alone, on operands already in the GEMM's layout and into a
    preallocated output: what the array library's BLAS gives these shapes.

    On the host, numpy over the same threads and bands as ours; on the device, one cuBLAS
    strided-batched product (``cupy.matmul``) over all sites.
    """
    SH = SW = sh.sites
    M, R, N = w.shape[2], w.shape[3] * w.shape[4] * w.shape[5], sh.N
    xp = backend.array_module(x)
    # drawn where they are used: on the device the paper shape's gathered patches are 3 GB
    draw = np.random.default_rng(1).standard_normal if xp is np else xp.random.standard_normal
    X = draw((SH * SW, R, N), dtype=np.float32).astype(x.dtype)
    D = draw((SH * SW, M, N), dtype=np.float32).astype(x.dtype)
    W = w.reshape(SH * SW, M, R)
    a, b, out = {"filter_forward": (W, X, xp.empty((SH * SW, M, N), x.dtype)),
                 "filter_bwd_data": (W.transpose(0, 2, 1), D, xp.empty((SH * SW, R, N), x.dtype)),
                 "filter_bwd_weights": (D, X.transpose(0, 2, 1), xp.empty((SH * SW, M, R), x.dtype))}[name]
    if xp is not np:
        return lambda: xp.matmul(a, b, out=out)
    bounds = chunk_bounds(SH, SW * R * N * x.dtype.itemsize)

    def work(i0: int, i1: int) -> None:
        np.matmul(a[i0 * SW:i1 * SW], b[i0 * SW:i1 * SW], out=out[i0 * SW:i1 * SW])

    return lambda: run_ranges(bounds, work)


def _shape(s: Shape | str, known: list[Shape]) -> Shape:
    if isinstance(s, Shape):
        return s
    for sh in known:
        if sh.name == s.strip():
            return sh
    raise ValueError(f"--shapes: no shape {s.strip()!r} here; the shapes are {', '.join(k.name for k in known)}")


def _best_peer(peers: dict[str, dict[str, Any]]) -> tuple[str, float] | None:
    timed = [(p, r["seconds"]) for p, r in peers.items() if r.get("seconds")]
    return min(timed, key=lambda t: t[1]) if timed else None


def run(repeats: int = 10, dtype: Any = np.float32, log=sys.stdout, min_time: float = 0.2,
        backend_name: str = "numpy", peer: bool = False, shapes: list[Shape] | None = None,
        machine: dict[str, Any] | None = None, peer_compile: str | None = None,
        peer_compile_budget: float | None = None, on_shape: Callable[[dict[str, Any]], None] | None = None
        ) -> dict[str, Any]:
    """Measure every shape (``shapes``, default the backend's list); print a table; return the numbers.

    On the numpy backend each filter pass is also compared with its batched products alone
    (:func:`matmul_alone`).  ``peer``: also run the PyTorch (eager, compiled) and JAX
    formulations that import, each checked first to compute our function on the shape, and
    timed interleaved with ours; ``ratio`` = peer time / our time (> 1: ours faster), and
    ``best_peer`` the fastest of them.  Beside ``cuda`` the PyTorch peers run on the same GPU, beside
    the others on the CPU; ``peer_compile`` (``all``, ``filter``: the filter passes and the step, ``none``)
    and ``peer_compile_budget`` (seconds of compiling per shape) bound ``torch-compile`` (None: the
    device's default, :func:`cotsdl.bench.peers.plan`).  ``on_shape``: called with the results so far
    (``complete`` false) after each shape, so that a run stopped by a time limit leaves them.  ``machine``
    (a loaded machine): the run planner's time of each pass on it beside ours (``predicted_seconds``,
    ``predicted_over_measured``).
    """
    dtype = np.dtype(dtype)
    item = dtype.itemsize
    say = lambda *a: print(*a, file=log, flush=True)  # noqa: E731
    xp, sync, dev = np, _no_sync, None
    default_shapes = {"cuda": SHAPES + [PAPER], "cuda-emu": [TINY]}.get(backend_name, NUMPY_SHAPES)
    known = default_shapes + EXTRA_SHAPES.get(backend_name, [])
    shapes = default_shapes if shapes is None else [_shape(s, known) for s in shapes]
    if backend_name == "cuda":
        cupy = backend.cupy_module()
        xp, sync = cupy, cupy.cuda.get_current_stream().synchronize
        dev = device_ceilings()
        ceiling = dev["fp32_peak_GFLOPs"]
    elif backend_name == "cuda-emu":
        ceiling = sgemm_ceiling()
    else:
        ceiling = sgemm_ceiling()
    peers: list[str] = []
    pplan = None
    if peer:
        pplan = peer_plan(cupy.cuda.Device().id if backend_name == "cuda" else None, peer_compile, peer_compile_budget)
        peers, libs = pplan.names, peers_importable()
        if not libs:
            say("(--peer: neither PyTorch nor JAX is importable; no peers run. pip install -e .[bench])")
        elif "jax" not in libs:
            say("(--peer: JAX is not importable; PyTorch peers only)")
        elif "torch" not in libs:
            say("(--peer: PyTorch is not importable; JAX peer only)")
        for p, why in pplan.skipped.items():
            say(f"(--peer: {p} {why})")
        if any(p.startswith("torch") for p in peers):
            passes = {"all": "every pass", "filter": "the filter passes and train_step"}.get(pplan.compile)
            say(f"(--peer: PyTorch on {pplan.device}" + (f"; torch.compile for {passes}" if passes else "")
                + (f", at most {pplan.compile_budget:g} s of compiling per shape" if passes and pplan.compile_budget
                   is not None else "") + ")")
        if pplan.on_gpu and any(p.startswith("torch") for p in peers):
            # CuPy's stream and torch's may differ: every clock (ours too) waits for the whole device
            # (torch.cuda.synchronize; CuPy and torch share the device's primary context)
            sync = pplan.sync
    alone = backend_name in ("numpy", "cuda")  # the batched products alone beside each filter pass
    out: dict[str, Any] = {"benchmark": "layers", "backend": backend_name, "dtype": dtype.name,
                           "threads": ops.num_threads(), "sgemm_2048_GFLOPs": None if dev else ceiling,
                           "device": dev, "peers": peers if peer else None, "interleaved": True, "results": [],
                           "peer_devices": pplan.where if pplan else None,
                           "peers_skipped": pplan.skipped if pplan else None,
                           "peer_compile": ({"passes": pplan.compile, "budget_seconds_per_shape": pplan.compile_budget}
                                            if pplan else None),
                           "machine": None if machine is None else machine["name"], "complete": False}
    if dev:
        say(f"cotsdl bench layers: cuda, {dev['name']}, {dtype.name}; fp32 peak {dev['fp32_peak_GFLOPs'] / 1e3:.1f} "
            f"TFLOP/s, memory {dev['memory_GBps']:.0f} GB/s (device properties); cuBLAS sgemm 8192^3 "
            f"{dev['cublas_sgemm_GFLOPs'] / 1e3:.1f} TFLOP/s (same run)")
    else:
        say(f"cotsdl bench layers: {backend_name}, {dtype.name}, {ops.num_threads()} thread(s); "
            f"sgemm 2048^3 ceiling {ceiling:.1f} GFLOP/s (same run)")
    peer_head = "".join(f" {'/' + p:>14}" for p in peers) + (f" {'best peer':>20}" if peers else "")
    say(f"{'shape':9} {'op':18} {'ms':>9} {'GFLOP/s':>9} {'of sgemm' if dev is None else 'of peak':>9} "
        + (f"{'matmul':>7} {'of mm':>6} " if alone else "") + f"{'GB/s':>8}"
        + (f" {'pred ms':>9} {'pred/meas':>9}" if machine else "") + peer_head)
    if alone:
        say(f"{'':48}(matmul: the batched products alone, same operands"
            + (" and threads, as a fraction of sgemm;" if dev is None else
               ", one cuBLAS strided-batched call, as a fraction of peak;"))
        say(f"{'':48} of mm: their time / ours)")
    if machine:
        say(f"{'':48}(pred: cotsdl plan's time of the pass on machine {machine['name']}, a rank of "
            f"{ops.num_threads()} thread(s))")
    if peers:
        say(f"{'':48}(peer time / ours, peer ms: ratio > 1 means ours is faster; '≠': disagrees, not timed;"
            " 'skip': not run)")
    fkey = "fraction_of_sgemm" if dev is None else "fraction_of_peak"
    for sh in shapes:
        if dev is None:  # the ceiling again, in this shape's conditions; the highest counts (the run's
            # first measurement came out at 0.6 of the later ones in several runs here)
            again = sgemm_ceiling()
            if again > ceiling:
                say(f"(sgemm 2048^3 before {sh.name}: {again:.1f} GFLOP/s, the ceiling from here on)")
                ceiling = again
                out["sgemm_2048_GFLOPs"] = ceiling
        rng = np.random.default_rng(0)
        x = xp.asarray(rng.standard_normal((sh.H, sh.H, sh.C, sh.N)).astype(dtype))
        M = sh.block[0] * sh.block[1] * sh.K
        w = xp.asarray((rng.standard_normal((sh.sites, sh.sites, M, sh.r, sh.r, sh.C), dtype=np.float32) / sh.r).astype(dtype))
        size, stride = (sh.r, sh.r), (sh.s, sh.s)
        # As in a training step: the layer's scratch in a workspace the network plan holds, its results
        # in memory the plan lends for the step (NetworkPlan.step; each call here is one step).
        lent = ops.Outputs()
        ws = ops.Workspace(lent)
        y = ops.local_filter(x, w, stride, sh.block)
        dy = xp.asarray(rng.standard_normal(y.shape).astype(dtype))
        fc = costs.local_filter(sh.H, sh.H, sh.C, sh.N, size, stride, sh.block, sh.K, item)
        p = ops.l2_pool(y, **POOL)
        dp = xp.ones_like(p)
        pc = costs.l2_pool(*y.shape, POOL["size"], POOL["stride"], item)
        lc = costs.lcn(*y.shape, LCN["size"], item)
        shapes = {"filter": filter_pass_shape(size, stride, sh.block, sh.K, sh.C, sh.N),
                  "pool": pool_pass_shape(POOL["size"], POOL["stride"], y.shape[2], sh.N),
                  "lcn": lcn_pass_shape(LCN["size"], y.shape[2], sh.N)}
        runs = {
            "filter_forward": (lambda: ops.local_filter(x, w, stride, sh.block, workspace=ws), fc["forward"]),
            "filter_bwd_data": (lambda: ops.local_filter_backward_data(dy, w, stride, sh.block, input_shape=x.shape,
                                                                       workspace=ws), fc["backward_data"]),
            "filter_bwd_weights": (lambda: ops.local_filter_backward_weights(x, dy, size, stride, sh.block, workspace=ws),
                                   fc["backward_weights"]),
            "pool_forward": (lambda: ops.l2_pool(y, **POOL, workspace=ws), pc["forward"]),
            "pool_backward": (lambda: ops.l2_pool_backward(dp, y, p, POOL["size"], POOL["stride"], workspace=ws),
                              pc["backward"]),
            "lcn_forward": (lambda: ops.lcn(y, **LCN, workspace=ws), lc["forward"]),
            "lcn_backward": (lambda: ops.lcn_backward(dy, y, **LCN, workspace=ws), lc["backward"]),
        }
        if backend_name == "numpy":
            runs = {name: (as_step(lent, fn), cost) for name, (fn, cost) in runs.items()}
        if backend_name != "cuda-emu":
            # a whole step of the stage's autoencoder: 5 filter passes and the pool
            runs["train_step"] = (lambda: sparse_ae_loss(x, w, stride=stride, block=sh.block, pool_size=POOL["size"],
                                                         pool_stride=POOL["stride"], lam=TRAIN_LAM, eps=POOL["eps"],
                                                         copy=False),
                                  costs.Cost(5 * fc["forward"].flops, 0.0))
        row: dict[str, Any] = {"shape": sh.name, "H": sh.H, "W": sh.H, "C": sh.C, "r": sh.r, "s": sh.s, "K": sh.K,
                               "N": sh.N, "block": list(sh.block), "ceiling_GFLOPs": ceiling, "ops": {}}
        found = peer_callables(sh, {"x": x, "w": w, "dy": dy, "y": y, "p": p, "dp": dp},
                               {name: _kept(fn()) for name, (fn, _) in runs.items()}, pplan, say) if peers else {}
        for name, (fn, cost) in runs.items():
            contestants: dict[str, Callable[[], Any]] = {"ours": fn}
            if alone and name.startswith("filter") and w.nbytes <= ALONE_MAX_WEIGHT_BYTES:
                contestants["matmul"] = matmul_alone(name, x, w, dy, sh)
            recs = {pname: rec for pname, (rec, _) in found.get(name, {}).items()}
            contestants.update({pname: call for pname, (_, call) in found.get(name, {}).items() if call is not None})
            with single_threaded_blas():  # no idle BLAS threads spinning beside whatever is timed
                times = interleaved_best(contestants, repeats, min_time, sync)
            t = times["ours"]
            rec: dict[str, Any] = {"seconds": t, "GFLOPs": cost.flops / t / 1e9, "GBps": cost.bytes / t / 1e9}
            if name.startswith("filter"):
                rec[fkey] = rec["GFLOPs"] / ceiling
                if dev is not None:
                    rec["fraction_of_cublas_sgemm"] = rec["GFLOPs"] / dev["cublas_sgemm_GFLOPs"]
                if "matmul" in times:
                    rec["matmul_alone_seconds"] = times["matmul"]
                    rec[f"matmul_alone_{fkey}"] = cost.flops / times["matmul"] / 1e9 / ceiling
                    rec["fraction_of_matmul_alone"] = times["matmul"] / t
            elif dev is not None:
                rec["fraction_of_bandwidth"] = rec["GBps"] / dev["memory_GBps"]
            pred = ""
            if machine is not None:
                rec["predicted_seconds"] = predicted(machine, name, cost, fc, pc, shapes)
                rec["predicted_over_measured"] = rec["predicted_seconds"] / t
                pred = f" {rec['predicted_seconds'] * 1e3:9.3f} {rec['predicted_over_measured']:9.2f}"
            cells = []
            if peers:
                for pname, pr in recs.items():
                    if pname in times:
                        pr["seconds"], pr["ratio"] = times[pname], times[pname] / t
                rec["peers"] = recs
                for pname in peers:
                    pr = recs.get(pname)
                    cells.append(f"{'-':>15}" if pr is None else f"{'skip':>15}" if pr["agrees"] is None
                                 else f"{'≠':>15}" if not pr["agrees"]
                                 else f" {pr['ratio']:6.2f} ({pr['seconds'] * 1e3:.2g})".rjust(15))
                best = _best_peer(recs)
                if best is not None:
                    rec["best_peer"] = {"peer": best[0], "seconds": best[1], "ratio": best[1] / t}
                    cells.append(f" {best[1] / t:6.2f} {best[0]}".rjust(21))
            frac = f"{rec[fkey]:9.2f}" if fkey in rec else f"{'':9}"
            mm = ""
            if alone:
                mm = (f"{rec[f'matmul_alone_{fkey}']:7.2f} {rec['fraction_of_matmul_alone']:6.2f} "
                      if "matmul_alone_seconds" in rec else f"{'':7} {'':6} ")
            gbs = f"{rec['GBps']:8.2f}" if not name.startswith(("filter", "train")) else f"{'':8}"
            say(f"{sh.name:9} {name:18} {t * 1e3:9.3f} {rec['GFLOPs']:9.1f} {frac} {mm}{gbs}{pred}" + "".join(cells))
            row["ops"][name] = rec
        out["results"].append(row)
        del found, contestants
        if pplan is not None:
            pplan.release()
        if on_shape is not None:
            on_shape(out)
    out["complete"] = True
    for row in out["results"]:
        for name, rec in row["ops"].items():
            for pname, pr in rec.get("peers", {}).items():
                if pr["agrees"] is None:
                    say(f"peer {pname} on {row['shape']} {name}: {pr['skipped']}")
                elif not pr["agrees"]:
                    say(f"peer {pname} disagrees on {row['shape']} {name}: "
                        + (pr.get("error") or f"max relative error {pr['max_rel_error']:.2e}"))
    return out
