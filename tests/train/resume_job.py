"""A small training job for the resume test: mpiexec -n P python -m mpi4py resume_job.py MODE CKDIR OUT [CRASH_AT].

MODE is "fresh" (train from scratch; with CRASH_AT the process dies, without any
cleanup, when it reads the batch of that global step) or "resume" (continue from the
latest checkpoint in CKDIR).  Rank 0 writes the final weights of every stage to OUT.
"""
import os
import sys

import numpy as np
from mpi4py import MPI

from cotsdl.nn import Network
from cotsdl.train import GreedyTrainer, InMemorySource, Momentum

DESC = {"input": [14, 13, 1], "stages": [
    {"filter": {"size": [4, 4], "stride": [1, 1], "channels": 3}, "pool": {"size": [2, 2], "stride": [2, 2], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}},
    {"filter": {"size": [3, 2], "stride": [1, 1], "channels": 2}, "pool": {"size": [2, 2], "stride": [1, 1], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}}]}
STEPS = [5, 5]


class Crashing(InMemorySource):
    def __init__(self, images, crash_at):
        super().__init__(images, seed=3)
        self.crash_at = crash_at

    def read(self, first, count, window):
        if self.crash_at is not None and first // count >= self.crash_at:  # one replica: batch index
            os._exit(3)  # a kill: no exception handling, no flushing
        return super().read(first, count, window)


mode, ckdir, out = sys.argv[1:4]
crash_at = int(sys.argv[4]) if len(sys.argv) > 4 else None
comm = MPI.COMM_WORLD
images = np.random.default_rng(0).standard_normal((30, 14, 13, 1)).astype(np.float32)
data = Crashing(images, crash_at)
opt = Momentum(0.01, 0.9)
if mode == "fresh":
    tr = GreedyTrainer(Network.from_description(DESC), data, opt, comm=comm, batch=4, lam=0.1, log_every=0,
                       checkpoint_dir=ckdir if ckdir != "-" else None, checkpoint_every=3)
else:
    tr = GreedyTrainer.resume(ckdir, data, opt, comm=comm, log_every=0)
tr.train(STEPS)
weights = [tr.gather_weights(k) for k in range(len(STEPS))]
if comm.Get_rank() == 0:
    np.savez(out, *weights)
