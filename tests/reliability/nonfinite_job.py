"""A non-finite gradient injected on one rank: mpiexec -n 2 python -m mpi4py nonfinite_job.py MODE CKDIR OUTDIR.

MODE "once": batch 7 is NaN on rank 1 only; training must skip that step on every rank and count it.
MODE "repeat": every batch from 12 on is NaN on rank 1 only; with max_bad_steps=3 training must stop
with a RuntimeError naming the last checkpoint (step 10), which must stay intact.
Every rank writes one line ``RESULT rank=R ...`` to OUTDIR/resultR.txt; the exit status is 0 when the rank saw what it expected.
"""
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

from cotsdl.io import checkpoint
from cotsdl.nn import Network
from cotsdl.train import Adam, GreedyTrainer, InMemorySource

DESC = {"input": [12, 12, 1], "stages": [
    {"filter": {"size": [3, 3], "stride": [1, 1], "channels": 3}, "pool": {"size": [2, 2], "stride": [2, 2], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}},
    {"filter": {"size": [2, 2], "stride": [1, 1], "channels": 2}, "pool": {"size": [2, 2], "stride": [1, 1], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}}]}


class Poisoned(InMemorySource):
    """NaN pixels on one rank only, for the chosen batches (global batch index = first // count)."""

    def __init__(self, images, bad, rank):
        super().__init__(images, seed=3)
        self.bad, self.rank = bad, rank

    def read(self, first, count, window):
        x = super().read(first, count, window)
        if self.rank == 1 and self.bad(first // count):
            x = x.copy()
            x[...] = np.nan
        return x


mode, ckdir, outdir = sys.argv[1:4]
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
images = np.random.default_rng(0).standard_normal((40, 12, 12, 1)).astype(np.float32)
bad = (lambda b: b == 7) if mode == "once" else (lambda b: b >= 12)
data = Poisoned(images, bad, rank)
tr = GreedyTrainer(Network.from_description(DESC), data, Adam(0.002), comm=comm, batch=4, lam=0.1, log_every=0,
                   checkpoint_dir=ckdir, checkpoint_every=5, keep=20, max_bad_steps=3)
ok = True
if mode == "once":
    tr.train([10, 10])
    ok = tr.skipped == 1 and tr.step == 20
    result = (f"RESULT rank={rank} skipped={tr.skipped} step={tr.step}")
else:
    try:
        tr.train([10, 10])
        result = (f"RESULT rank={rank} no error (step {tr.step}, skipped {tr.skipped})")
        ok = False
    except RuntimeError as e:
        found, skipped = checkpoint.latest_verified(ckdir)
        ok = ("ckpt-000000010" in str(e) and found is not None and found.name == "ckpt-000000010"
              and not skipped and tr.skipped == 3)
        result = (f"RESULT rank={rank} stopped: latest verified {found and found.name}, skipped {skipped}, "
              f"trainer.skipped={tr.skipped}; error: {e}")
Path(outdir, f"result{rank}.txt").write_text(result + "\n")
comm.Barrier()
sys.exit(0 if ok else 3)
