"""A distributed forward and backward of a 2-stage network with COTSDL_BACKEND=cuda-emu
(every layer on the CUDA kernels, run by the emulator) equals the numpy backend."""
import numpy as np
import pytest

from cotsdl import backend
from cotsdl.nn import Network
from helpers import agree, grids
from netcases import DESC
from test_network import run

TWO = {"input": DESC["input"], "stages": DESC["stages"][:2]}


@pytest.mark.parametrize("dims", grids()[:1])
def test_two_stage_network_on_emulated_kernels(comm, monkeypatch, dims):
    import test_network

    monkeypatch.setattr(test_network, "network", lambda: Network.from_description(TWO))
    with backend.using("numpy"):
        ref = run(comm, dims, np.float32)
    with backend.using("cuda-emu"):
        emu = run(comm, dims, np.float32)
    ok = True
    if comm.Get_rank() == 0:
        for key in ref:
            scale = max(float(np.abs(ref[key]).max()), 1e-30)
            ok = ok and float(np.abs(emu[key] - ref[key]).max()) <= 1e-4 * scale
    assert agree(comm, ok)
