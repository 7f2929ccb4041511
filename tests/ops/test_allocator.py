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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_script_that_trains_gets_it_too():
    """Library use was slower than the command (page faults on every temporary of every step)."""
    code = ("import numpy as np; from mpi4py import MPI; from cotsdl.nn import Network; "
            "from cotsdl.train import Adam, GreedyTrainer, InMemorySource; from cotsdl.ops.cpu import allocator; "
            "from test_trainer_hybrid import DESC; "
            "GreedyTrainer(Network.from_description(DESC), InMemorySource(np.zeros((8, 14, 13, 1))), Adam(0.01), "
            "comm=MPI.COMM_WORLD, batch=4, log_every=0); print(allocator._done)")
    env = {k: v for k, v in os.environ.items() if k != "COTSDL_MALLOC"}
    tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([tests, os.path.join(tests, "mpi")])
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.stdout.split() == ["True"], res.stdout + res.stderr
