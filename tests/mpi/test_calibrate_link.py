"""``cotsdl bench calibrate`` on P ranks: the link fit (ranks 0 and 1), the same machine on every rank."""
import io

import pytest

from cotsdl.bench import calibrate
from helpers import P, agree


@pytest.fixture(scope="module")
def machine():
    from mpi4py import MPI

    log = io.StringIO()
    m = calibrate.run(MPI.COMM_WORLD, repeats=1, quick=True, log=log)
    return m, log.getvalue()


def test_every_rank_gets_the_same_machine(comm, machine):
    m, _ = machine
    mine = (m["device"], m["efficiency"], m["overhead_s"], m["link"])
    assert agree(comm, mine == comm.bcast(mine, root=0))


@pytest.mark.skipif(P < 2, reason="one rank: there is no link to measure")
def test_link_fit_explains_the_pingpong(comm, machine):
    m, log = machine
    a, b = m["link"]["alpha_s"], m["link"]["beta_s_per_byte"]
    assert a > 0 and b > 0
    rows = m["calibration"]["pingpong"]
    assert len(rows) >= 4 and "ping-pong" in m["source"]
    for r in rows:
        assert r["model_s"] == pytest.approx(a + b * r["bytes"])
        assert 0.5 <= r["model_s"] / r["seconds"] <= 2.0, rows
    ex = m["calibration"]["halo_exchanges"]
    assert len(ex) == 2 and all(e["messages"] >= 1 and e["seconds"] > 0 and e["model_s"] > 0 for e in ex)
    if comm.Get_rank() == 0:
        assert "fit: alpha" in log and "meas/model" in log


@pytest.mark.skipif(P > 1, reason="the one-rank stand-in")
def test_one_rank_says_the_link_is_not_measured(machine):
    m, log = machine
    assert "NOT MEASURED" in m["source"] and "NOT MEASURED" in m["calibration"]["link_measured"]
    assert m["calibration"]["halo_exchanges"] == [] and "copy" in m["calibration"]
    assert m["link"]["alpha_s"] > 0 and m["link"]["beta_s_per_byte"] > 0
