"""The cotsdl command's allocator setting: on with glibc, once per process, off on request."""
import os
import subprocess
import sys

import pytest

CODE = "from cotsdl.ops.cpu.allocator import tune_allocator as t; print(t(), t())"


def run(**env):
    res = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **env})
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_tuned_once_and_not_on_request():
    assert run() == ["True", "True"]
    assert run(COTSDL_MALLOC="default") == ["False", "False"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_command_tunes_it():
    res = subprocess.run([sys.executable, "-c", "from cotsdl.cli import main; from cotsdl.ops.cpu import allocator; "
                          "print(main(['plan', 'nope.toml']), allocator._done)"],
                         capture_output=True, text=True, timeout=60, env={k: v for k, v in os.environ.items()
                                                                          if k != "COTSDL_MALLOC"})
    assert res.stdout.split() == ["2", "True"], res.stdout + res.stderr


STEP_FAULTS = """
import contextlib, resource, sys
import numpy as np
from mpi4py import MPI
from cotsdl.nn import Network, NetworkPlan
from cotsdl.ops.cpu import allocator
from cotsdl.train import Adam, GreedyTrainer, InMemorySource
from cotsdl.train.objective import StageObjective
if sys.argv[1] == "fresh":  # what a step cost before the plan lent its memory: every array new
    NetworkPlan.step = lambda self: contextlib.nullcontext()
desc = {"input": [48, 48, 1], "stages": [{"filter": {"size": [7, 7], "stride": [1, 1], "channels": 16},
        "pool": {"size": [2, 2], "stride": [2, 2], "eps": 0.01}, "lcn": {"size": 5, "sigma": 1.0, "eps": 1e-4}}]}
images = np.random.default_rng(0).standard_normal((32, 48, 48, 1)).astype(np.float32)
tr = GreedyTrainer(Network.from_description(desc), InMemorySource(images), Adam(0.01), comm=MPI.COMM_WORLD,
                   batch=16, log_every=0)
obj = StageObjective(tr.plan, 0, tr.lam, tr.tied)
tr.train_stage(0, 2)
for _ in range(3):
    tr._train_step(0, obj)
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    tr._train_step(0, obj)
print(allocator._done, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 5)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and page-fault counts")
def test_a_script_trains_without_page_faults_and_with_malloc_untouched():
    """A script gets the command's speed from the plan's lent memory (NetworkPlan.step) and the
    optimizer's kept work arrays, not from process-wide malloc settings: its steps page-fault a
    small fraction of what they do with fresh arrays (measured here: 78 against 2732 per step)."""
    env = {k: v for k, v in os.environ.items() if k != "COTSDL_MALLOC"}
    # glibc's worst case: every block over 128 KiB mapped afresh and unmapped on free (no adaptive
    # threshold), so any weight- or activation-sized array made anew in a step shows as page faults.
    env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    got = {}
    for how in ("lent", "fresh"):
        res = subprocess.run([sys.executable, "-c", STEP_FAULTS, how], capture_output=True, text=True, timeout=300,
                             env=env)
        assert res.returncode == 0, res.stderr
        tuned, faults = res.stdout.splitlines()[-1].split()
        assert tuned == "None", "GreedyTrainer must leave the process's malloc alone"
        got[how] = float(faults)
    assert got["fresh"] > 500, got  # the test measures something: fresh arrays do fault here
    assert got["lent"] < got["fresh"] / 10, got
