"""Ranks that disagree on the arguments of a collective call get one clear error on every rank, not a hang."""
import numpy as np
import pytest

from cotsdl.array.collective import agree
from cotsdl.nn import Network
from cotsdl.train import Adam, GreedyTrainer, InMemorySource
from helpers import P
from test_trainer_hybrid import DESC

pytestmark = pytest.mark.skipif(P < 2, reason="disagreement needs two ranks")


def trainer(comm, **kw):
    imgs = np.random.default_rng(0).standard_normal((30, 14, 13, 1))
    args = dict(batch=4, lam=0.1, seed=0, log_every=0)
    args.update(kw)
    return GreedyTrainer(Network.from_description(DESC), InMemorySource(imgs), Adam(0.01), comm=comm, **args)


def test_agree_names_the_value_and_every_rank(comm):
    agree(comm, same=[1, 2], text="x")
    with pytest.raises(ValueError, match=r"ranks disagree on halos: rank 0: \[1, 2\], rank 1: \[1, 2, 1\]"):
        agree(comm, same=3, halos=[1, 2] + [1] * comm.Get_rank())


@pytest.mark.parametrize("what, kw", [("seed", lambda r: {"seed": r}), ("lam", lambda r: {"lam": 0.1 * (r + 1)}),
                                      ("batch", lambda r: {"batch": 4 + r})])
def test_trainers_that_disagree_refuse_to_start(comm, what, kw):
    with pytest.raises(ValueError, match=f"ranks disagree on {what}"):
        trainer(comm, **kw(comm.Get_rank()))


def test_different_step_counts_fail_instead_of_hanging(comm):
    tr = trainer(comm)
    with pytest.raises(ValueError, match=r"ranks disagree on steps: rank 0: 2, rank 1: 3"):
        tr.train_stage(0, 2 + comm.Get_rank())
    with pytest.raises(ValueError, match="ranks disagree on steps_per_stage"):
        tr.train([2, 2 + comm.Get_rank()])
    tr.train_stage(0, 1)  # still usable afterwards
    tr.decomposition.free()


def test_a_machine_failure_on_one_rank_is_an_oserror_on_every_rank(comm):
    """A full disk on the last rank (an OSError passed as the error) is raised as an OSError everywhere
    (exit 1), bad input as the given type (exit 2); the lowest failing rank's message wins."""
    from cotsdl.array.collective import raise_collectively
    from cotsdl.io.atomic import DiskError

    last = comm.Get_size() - 1
    with pytest.raises(OSError, match=rf"disk full on {last} \[reported by rank {last} of"):
        raise_collectively(comm, DiskError(f"disk full on {last}") if comm.Get_rank() == last else None)
    with pytest.raises(ValueError, match=r"bad \[reported by rank 0 of .*; 1 more rank\(s\) failed too"):
        raise_collectively(comm, "bad" if comm.Get_rank() == 0 else (OSError("full") if comm.Get_rank() == 1 else None))
