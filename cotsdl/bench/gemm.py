"""``cotsdl bench gemm``: the filter kernels' GEMM loading variants against each other and the model.

Per shape (default: the paper-sized layer and shapes A to D of ``bench layers``) and filter
pass, every variant of :data:`cotsdl.ops.cuda.filter.VARIANTS` (through registers, cp.async
pipelines of 2 to 4 stages) is checked against the kernel's default variant's result (against
numpy: the GPU suite), then all are
timed in interleaved rounds (minimum over rounds, CUDA-synchronized wall clock).  Beside each:
the kernel's registers and static shared memory as the device's compiler built it, the blocks an
SM holds, and :mod:`cotsdl.planner.gemm`'s predicted time; the fastest variant per pass is named.
The variants differ only on the 128-row float32 tiles: where a pass uses a small tile they are the
same kernel (reported, not timed twice).

``--backend cuda-emu`` runs two tiny shapes through the emulator, one of them on the 128-row tiles
(proves the path; the times mean nothing and no prediction is made).
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .. import backend
from ..ops import costs
from ..ops.cuda import filter as cuda_filter
from ..planner import gemm as model
from .layers import PAPER, SHAPES, TINY, Shape, device_ceilings
from .peers import FILTER_PASSES
from .sampling import interleaved_best

PASSES = FILTER_PASSES
#: Largest difference from the default variant's result, relative to its largest value, that agrees
AGREE = 1e-5
#: For the emulator: a shape on the 128-row tiles (M = 128, N = 96), so that every variant runs
EMU_PIPELINE = Shape("emu-128", 7, 8, 5, 2, 32, 96, (2, 2))


def _product(name: str, sh: Shape) -> tuple[str, int, int, int]:
    """The pass's GEMM kernel and its product: (kernel, rows, columns, blocks of the grid's first axis)."""
    S = sh.sites * sh.sites
    M, R = sh.block[0] * sh.block[1] * sh.K, sh.r * sh.r * sh.C
    if name == "filter_forward":
        return "filter_fwd", M, sh.N, S
    if name == "filter_bwd_weights":
        return "filter_bwd_weights", M, R, S
    if cuda_filter.by_sites(sh.s, sh.s, sh.C):
        return "filter_bwd_data_sites", R, sh.N, S
    return "filter_bwd_data", sh.s * sh.s * sh.C, sh.N, (-(-sh.H // sh.s)) ** 2


def _resources(kern: Any) -> tuple[int | None, int | None]:
    """Registers a thread and static shared bytes of a compiled kernel (None where unknown: the emulator)."""
    try:
        return int(kern.num_regs), int(kern.shared_size_bytes)
    except (AttributeError, TypeError, RuntimeError):
        return None, None


def _same(got: Any, want: Any) -> float:
    """Largest difference relative to the largest value, computed where the arrays are (the paper
    layer's weight gradients are 4.2 GB: a host copy in float64 would take longer than the timing)."""
    xp = backend.array_module(want)
    return float(xp.abs(got - want).max()) / max(float(xp.abs(want).max()), 1e-30)


def run(backend_name: str = "cuda", shapes: list[Shape] | None = None, repeats: int = 8, min_time: float = 0.1,
        log=sys.stdout, variants: list[str] | None = None) -> dict[str, Any]:
    """Time every GEMM variant of every filter pass on ``shapes``; print a table; return the numbers."""
    say = lambda *a: print(*a, file=log, flush=True)  # noqa: E731
    variants = list(variants or cuda_filter.VARIANTS)
    for v in variants:
        if v not in cuda_filter.VARIANTS:
            raise ValueError(f"--variants: no variant {v!r}; the variants are {', '.join(cuda_filter.VARIANTS)}")
    dev, dmodel, sync, xp = None, None, (lambda: None), np
    if backend_name == "cuda":
        cupy = backend.cupy_module()
        xp, sync = cupy, cupy.cuda.get_current_stream().synchronize
        dev = device_ceilings()
        sms = cupy.cuda.runtime.deviceGetAttribute(16, cupy.cuda.Device().id)
        dev["sms"] = sms
        dmodel = model.Device(dev["fp32_peak_GFLOPs"] * 1e9, sms)
        shapes = shapes or [PAPER] + SHAPES
        say(f"cotsdl bench gemm: {dev['name']}, {sms} SMs, fp32 peak {dev['fp32_peak_GFLOPs'] / 1e3:.1f} TFLOP/s; "
            f"cuBLAS sgemm {dev['cublas_sgemm_GFLOPs'] / 1e3:.1f} TFLOP/s (same run)")
    elif backend_name == "cuda-emu":
        shapes = shapes or [TINY, EMU_PIPELINE]
        say("cotsdl bench gemm: cuda-emu (the emulator: times mean nothing, no prediction)")
    else:
        raise ValueError(f"bench gemm runs the CUDA kernels: --backend cuda or cuda-emu, not {backend_name!r}")
    out: dict[str, Any] = {"benchmark": "gemm", "backend": backend_name, "device": dev, "variants": variants,
                           "default_variants": dict(cuda_filter.DEFAULT_VARIANTS), "results": []}
    say(f"{'shape':9} {'pass':18} {'variant':9} {'tile':>12} {'regs':>5} {'smem':>6} {'blk/SM':>6} "
        f"{'ms':>9} {'of peak':>7} {'pred ms':>8} {'pred/meas':>9} {'max diff':>9}")
    for sh in shapes:
        rng = np.random.default_rng(0)
        M = sh.block[0] * sh.block[1] * sh.K
        x = xp.asarray(rng.standard_normal((sh.H, sh.H, sh.C, sh.N), dtype=np.float32))
        w = xp.asarray(rng.standard_normal((sh.sites, sh.sites, M, sh.r, sh.r, sh.C), dtype=np.float32) / sh.r)
        stride, size = (sh.s, sh.s), (sh.r, sh.r)
        dy = xp.asarray(rng.standard_normal((sh.sites * sh.block[0], sh.sites * sh.block[1], sh.K, sh.N),
                                            dtype=np.float32))
        dw = xp.empty_like(w)
        fc = costs.local_filter(sh.H, sh.H, sh.C, sh.N, size, stride, sh.block, sh.K, 4)
        calls = {
            "filter_forward": (lambda: cuda_filter.filter_forward(x, w, stride, sh.block), fc["forward"]),
            "filter_bwd_data": (lambda: cuda_filter.filter_backward_data(dy, w, stride, sh.block, x.shape),
                                fc["backward_data"]),
            "filter_bwd_weights": (lambda: cuda_filter.filter_backward_weights(x, dy, size, stride, sh.block, out=dw),
                                   fc["backward_weights"]),
        }
        row: dict[str, Any] = {"shape": sh.name, "H": sh.H, "C": sh.C, "r": sh.r, "s": sh.s, "K": sh.K, "N": sh.N,
                               "block": list(sh.block), "passes": {}}
        for name in PASSES:
            fn, cost = calls[name]
            kname, rows, cols, blocks = _product(name, sh)
            tiles: dict[str, dict[str, int]] = {v: cuda_filter._tiles(rows, cols, np.float32, v) for v in variants}
            # variants that build the same kernel here are one contestant, named by the first of them
            same = {v: next(u for u in variants if tiles[u] == tiles[v]) for v in variants}
            runs = {v: (lambda v=v: _in_variant(v, fn)) for v in variants if same[v] == v}
            default = cuda_filter.variant(kname)  # the kernel's default, the reference
            ref = _in_variant(default, fn).copy()
            diffs = {v: _same(_in_variant(v, fn), ref) for v in runs}
            times = interleaved_best(runs, repeats, min_time, sync)
            recs: dict[str, Any] = {}
            for v in variants:
                t = tiles[v]
                key = same[v]
                kern = backend.kernel("filter.cu", f"{kname}_f32", t, device_array=backend_name == "cuda")
                regs, smem = _resources(kern)
                threads = (t["TM"] // t["RM"]) * (t["TN"] // t["RN"])
                rec: dict[str, Any] = {"same_kernel_as": None if key == v else key, "tile": t, "registers": regs,
                                       "shared_bytes": smem, "seconds": times[key], "max_rel_diff": diffs[key],
                                       "agrees_with_default": diffs[key] <= AGREE}
                if dev is not None:
                    rec["fraction_of_peak"] = cost.flops / times[key] / (dev["fp32_peak_GFLOPs"] * 1e9)
                if dmodel is not None and regs is not None:
                    b = model.resident_blocks(threads, regs, smem)
                    grid = blocks * -(-cols // t["TN"]) * -(-rows // t["TM"])
                    pred = model.seconds(cost.flops, t["TM"], t["TN"], t.get("TK", 16), t.get("GT_STAGES", 1), b,
                                         grid, dmodel)
                    rec.update(blocks_per_sm=b, predicted_seconds=pred, predicted_over_measured=pred / times[key])
                recs[v] = rec
                say(f"{sh.name:9} {name:18} {v:9} {t['TM']:>4}x{t['TN']:<3}s{t.get('GT_STAGES', 1)} "
                    f"{'-' if regs is None else regs:>5} {'-' if smem is None else smem:>6} "
                    f"{rec.get('blocks_per_sm', '-'):>6} {times[key] * 1e3:9.3f} "
                    f"{rec.get('fraction_of_peak', float('nan')):7.2f} "
                    f"{rec.get('predicted_seconds', float('nan')) * 1e3:8.3f} "
                    f"{rec.get('predicted_over_measured', float('nan')):9.2f} {diffs[key]:9.1e}"
                    + ("" if key == v else f"  (= {key})")
                    + ("" if rec["agrees_with_default"] else "  DISAGREES with the default"))
            agreeing = [v for v in runs if diffs[v] <= AGREE]
            fastest = min(agreeing, key=lambda v: times[v]) if agreeing else None
            row["passes"][name] = {"kernel": kname, "variants": recs, "fastest": fastest, "default": default,
                                   "fastest_over_default": (times[fastest] / times[same[default]]
                                                            if fastest and default in same else None)}
            say(f"{'':9} {name:18} fastest: {fastest}"
                + (f" ({row['passes'][name]['fastest_over_default']:.2f} of the default's time)"
                   if row["passes"][name]["fastest_over_default"] else ""))
        out["results"].append(row)
        del x, w, dy, dw, ref, calls, runs, fn
        if xp is not np:
            xp.get_default_memory_pool().free_all_blocks()
    return out


def _in_variant(v: str, fn):
    with cuda_filter.gemm_variant(v):
        return fn()
