"""Helpers shared by test folders: the pytest suites ``import testkit`` (setup.cfg puts ``tests/``
on pytest's path); the reliability suite, run as a module (``python -m tests.reliability.run``
from the repository root), imports it as ``tests.testkit``."""
from pathlib import Path

import h5py

#: A tiny 2-stage training config; format with data, run, steps, every (and size, c0, c1, keep).
TINY_CONFIG = """
[data]
file = "{data}"
batch = 4
[network]
input = [{size}, {size}, 1]
[[network.stages]]
filter = {{ size = [3, 3], stride = [1, 1], channels = {c0} }}
pool = {{ size = [2, 2], stride = [2, 2], eps = 0.01 }}
lcn = {{ size = 3, sigma = 1.0, eps = 0.001 }}
[[network.stages]]
filter = {{ size = [2, 2], stride = [1, 1], channels = {c1} }}
pool = {{ size = [2, 2], stride = [1, 1], eps = 0.01 }}
lcn = {{ size = 3, sigma = 1.0, eps = 0.001 }}
[train]
steps = [{steps}, {steps}]
checkpoint_every = {every}
keep = {keep}
log_every = 1
[train.optimizer]
kind = "adam"
lr = 0.002
[run]
folder = "{run}"
backend = "numpy"
"""


#: Filter shapes for the layer-kernel tests (emulator and GPU): every tile variant the CUDA
#: wrappers choose.
FILTER_CASES = [  # (H, W, C, N), size, stride, block, K
    ((9, 8, 3, 4), (3, 3), (2, 2), (1, 1), 2),
    ((10, 7, 1, 1), (4, 2), (3, 2), (2, 1), 3),        # C = 1, N = 1, strides that do not divide
    ((8, 9, 2, 37), (5, 4), (1, 2), (2, 3), 1),        # blocks, N not a multiple of the tile
    ((6, 6, 2, 70), (6, 6), (1, 1), (1, 1), 20),       # one site, M > 16, N > 64
    ((11, 13, 5, 3), (3, 5), (4, 3), (3, 2), 6),       # M = 36 > 32
    ((6, 7, 2, 70), (3, 3), (2, 2), (2, 2), 32),       # M = 128: the 128 x 96 float32 tile
    ((5, 5, 3, 64), (3, 2), (1, 2), (4, 1), 32),       # M = 128, N = 64: the 128 x 64 tile
    ((4, 5, 1, 128), (2, 3), (2, 1), (1, 1), 130),     # M = 130, N = 128: the 128 x 128 tile, a partial M tile
    ((9, 11, 2, 3), (2, 2), (3, 4), (1, 1), 2),        # strides past the field both ways: pixels no site covers
]
#: Cases on the 128-row tiles with many K chunks (the GEMM variants' pipelines run full): forward
#: R = 200 (13 chunks of 16), backward-weights N = 96, backward-data by sites M = 128.
PIPELINE_CASES = [
    ((7, 7, 8, 96), (5, 5), (2, 2), (2, 2), 32),       # 2 x 2 sites, M = 128, the 128 x 96 tile
    FILTER_CASES[7],                                   # the 128 x 128 tile, a partial M tile
]

#: The CUDA backend's ways of backward-data (cotsdl/ops/cuda/filter.py), by sites in chunks too.
BACKWARD_DATA_WAYS = ["cells", "sites", "sites, one row of sites at a time", "sites, two rows at a time"]


def backward_data_case(case, dtype, way, monkeypatch, rng):
    """(dy, w) of FILTER_CASES' ``case``, with the CUDA backend's backward-data forced to go ``way``: by
    cells or by sites, whichever its rule would choose, and by sites in chunks of one or two rows of
    sites (the last one partial where the rows are odd)."""
    import numpy as np

    from cotsdl.ops.cuda import filter as cuda_filter

    (H, W, C, N), size, stride, block, K = case
    SH, SW = (H - size[0]) // stride[0] + 1, (W - size[1]) // stride[1] + 1
    monkeypatch.setattr(cuda_filter, "by_sites", lambda *a: way != "cells")
    if way.startswith("sites,"):
        rows = 1 if "one row" in way else 2
        monkeypatch.setattr(cuda_filter, "SITES_BUFFER_BYTES", rows * SW * size[0] * size[1] * C * N * np.dtype(dtype).itemsize)
    w = rng.standard_normal((SH, SW, block[0] * block[1] * K, size[0], size[1], C)).astype(dtype)
    dy = rng.standard_normal((SH * block[0], SW * block[1], K, N)).astype(dtype)
    return dy, w


def tiny_config(data, run, steps, every, size=12, c0=3, c1=2, keep=3) -> str:
    return TINY_CONFIG.format(data=data, run=run, steps=steps, every=every, size=size, c0=c0, c1=c1, keep=keep)


def corrupt_chunk(path, index):
    """Overwrite the stored bytes of chunk ``index`` of ``images`` (one image per chunk) with garbage."""
    with h5py.File(path, "r") as f:
        info = f["images"].id.get_chunk_info(index)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset)
        fh.write(b"\xff" * info.size)


def final_weights(run):
    """(name, {(rank file, dataset): array}) of the w/... datasets of a run folder's latest committed
    checkpoint; (None, {}) when it has none."""
    ckpts = sorted(p for p in (Path(run) / "checkpoints").glob("ckpt-*") if (p / "index.json").exists())
    if not ckpts:
        return None, {}
    out = {}
    for f in sorted(ckpts[-1].glob("rank*.h5")):
        with h5py.File(f, "r") as h:
            h.visititems(lambda name, obj: out.__setitem__((f.name, name), obj[()])
                         if isinstance(obj, h5py.Dataset) and name.startswith("w/") else None)
    return ckpts[-1].name, out


#: The slurm.conf that tests/cluster/slurm-up.sh writes, and the line that marks it as its own.
SLURM_CONF = Path("/etc/slurm/slurm.conf")
SLURM_MARKER = "# written by cotsdl tests/cluster/slurm-up.sh"


def slurm_job(job_id):
    """scontrol's fields of a job (JobState, Restarts, ExitCode, NodeList, ...)."""
    import subprocess  # noqa: PLC0415

    out = subprocess.run(["scontrol", "show", "job", str(job_id)], capture_output=True, text=True).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def wait_for(cond, what, timeout=120, every=0.5):
    """``cond()``'s first true value, polled every ``every`` seconds; AssertionError after ``timeout``."""
    import time  # noqa: PLC0415

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")
