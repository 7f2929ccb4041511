"""Expected time of a filter pass's tiled GEMM kernel on a GPU, per loading variant.

A prediction, stated before a GPU times the variants (``cotsdl bench gemm`` sets it beside
the measurement).  The model, per SM, for one tile of TM x TN outputs streaming K in chunks
of TK (``cuda/gemm_tile.cuh``):

- a chunk's FMAs take ``t0 = 2 TM TN TK / (peak / SMs)`` on a whole SM;
- loading a chunk takes ``LOAD_SECONDS`` whatever its size (latency-bound: the issue and
  wait of a few scalar loads a thread), calibrated once: on an H100 the register-loaded
  forward of the paper layer ran at 0.21 of fp32 peak with one resident block
  (cuda/README.md); with ``ISSUE`` = 0.77 that gives ``t0 / (t0 + LOAD_SECONDS) = 0.27`` on
  its 128 x 96 x 16 chunks (t0 = 0.78 us), so ``LOAD_SECONDS`` = 2.1 us;
- through registers a block loads, then multiplies: a chunk costs it ``t0 + LOAD_S``;
  with S cp.async stages S - 1 chunks are in flight while one is multiplied: a chunk costs
  ``max(t0, LOAD_S / (S - 1))``;
- b resident blocks (registers, shared memory and threads allow) share the SM: it is busy a
  share ``min(1, b t0 / chunk cost)`` of the time, and at most ``ISSUE`` of its FMA rate is
  reached (instruction issue, shared-memory reads; cuBLAS's SIMT sgemm reached 0.77 of peak
  on the H100);
- the last wave of blocks may leave SMs idle.

What it leaves out: DRAM bandwidth (the paper layer's passes are compute-bound by 10x),
bank conflicts, the epilogue, and L2 misses beyond the calibrated load time.
"""
from __future__ import annotations

from dataclasses import dataclass

#: The reached fraction of the FMA rate when the SM is never waiting (cuBLAS sgemm on the H100: 0.77)
ISSUE = 0.77
#: A chunk's load time, seconds (calibrated on the H100, see the module docstring)
LOAD_SECONDS = 2.1e-6
#: Per-SM limits of compute capability 8.0 to 9.0 (registers, threads, shared memory per SM, blocks)
REGISTERS_PER_SM = 65536
THREADS_PER_SM = 2048
SHARED_PER_SM = 228 * 1024
BLOCKS_PER_SM = 32


@dataclass(frozen=True)
class Device:
    """What the model needs of a GPU: fp32 peak (FLOP/s) and its SM count."""
    peak_flops: float
    sms: int


def resident_blocks(threads: int, registers: int, shared_bytes: int) -> int:
    """Blocks of ``threads`` threads, ``registers`` a thread and ``shared_bytes`` each that one SM holds."""
    if threads <= 0 or registers <= 0:
        raise ValueError(f"threads and registers must be positive, got {threads} and {registers}")
    regs = REGISTERS_PER_SM // (-(-registers // 8) * 8 * threads)  # registers are allocated 8 at a time
    smem = SHARED_PER_SM // max(1, shared_bytes + 1024)  # 1 KiB a block is reserved by the runtime
    return max(0, min(regs, smem, THREADS_PER_SM // threads, BLOCKS_PER_SM))


def chunk_flop_seconds(tm: int, tn: int, tk: int, dev: Device) -> float:
    """t0: one chunk's FMAs on a whole SM."""
    return 2.0 * tm * tn * tk / (dev.peak_flops / dev.sms)


def efficiency(tm: int, tn: int, tk: int, stages: int, blocks_per_sm: int, grid_blocks: int, dev: Device) -> float:
    """Predicted fraction of fp32 peak for ``grid_blocks`` tiles, ``stages`` (1: through registers)."""
    if blocks_per_sm < 1 or grid_blocks < 1:
        return 0.0
    t0 = chunk_flop_seconds(tm, tn, tk, dev)
    cost = t0 + LOAD_SECONDS if stages <= 1 else max(t0, LOAD_SECONDS / (stages - 1))
    busy = min(1.0, blocks_per_sm * t0 / cost)
    slots = dev.sms * blocks_per_sm
    waves = -(-grid_blocks // slots)
    return ISSUE * busy * grid_blocks / (waves * slots)


def seconds(flops: float, tm: int, tn: int, tk: int, stages: int, blocks_per_sm: int, grid_blocks: int,
            dev: Device) -> float:
    """Predicted time of a pass of ``flops`` useful FLOPs (``inf`` if no block fits on an SM)."""
    e = efficiency(tm, tn, tk, stages, blocks_per_sm, grid_blocks, dev)
    return flops / (e * dev.peak_flops) if e > 0 else float("inf")
