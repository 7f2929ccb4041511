"""Helpers shared by test folders: the pytest suites ``import testkit`` (setup.cfg puts ``tests/``
on pytest's path); the reliability suite, run as a module (``python -m tests.reliability.run``
from the repository root), imports it as ``tests.testkit``."""
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


def tiny_config(data, run, steps, every, size=12, c0=3, c1=2, keep=3) -> str:
    return TINY_CONFIG.format(data=data, run=run, steps=steps, every=every, size=size, c0=c0, c1=c1, keep=keep)


def corrupt_chunk(path, index):
    """Overwrite the stored bytes of chunk ``index`` of ``images`` (one image per chunk) with garbage."""
    with h5py.File(path, "r") as f:
        info = f["images"].id.get_chunk_info(index)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset)
        fh.write(b"\xff" * info.size)
