"""``cotsdl bench emulator``: fiber switches per second of the CPU emulator.

The assembly context switch is measured against the portable ucontext fibers (the
peer, same run, same kernel): each thread of each block passes ``iters`` barriers.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..cudaemu import RawModule

PROBE = Path(__file__).resolve().parent.parent / "cudaemu" / "selfbench.cu"


def run(blocks: int = 8, threads: int = 256, iters: int = 200, log=sys.stdout) -> dict[str, Any]:
    say = lambda *a: print(*a, file=log, flush=True)  # noqa: E731
    out: dict[str, Any] = {"benchmark": "emulator", "blocks": blocks, "threads": threads, "iters": iters, "results": {}}
    switches = blocks * threads * (iters + 1)
    say(f"cotsdl bench emulator: {blocks} blocks x {threads} threads x {iters} barriers = {switches} fiber switches")
    for mode, opts in (("assembly", ()), ("ucontext", ("-DCOTSDL_EMU_UCONTEXT",))):
        fn = RawModule(path=PROBE, options=opts).get_function("barrier_loop")
        y = np.zeros(blocks * threads, np.float32)
        fn((blocks,), (threads,), (y, np.int32(1)))  # warm-up: stacks, page faults
        t0 = time.perf_counter()
        fn((blocks,), (threads,), (y, np.int32(iters)))
        dt = time.perf_counter() - t0
        out["results"][mode] = {"seconds": dt, "switches_per_s": switches / dt}
        say(f"  {mode:9s} {dt * 1e3:9.1f} ms  {switches / dt / 1e6:7.2f} million switches/s")
    a, u = out["results"]["assembly"], out["results"]["ucontext"]
    say(f"  assembly / ucontext speed: {a['switches_per_s'] / u['switches_per_s']:.1f}x")
    return out
