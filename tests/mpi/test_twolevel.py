"""The two-level gradient sum (cotsdl.array.twolevel, train.allreduce.Reduction) equals the flat one.

One machine is one node here, so the nodes are labels given to the ranks (``TwoLevel(comm, nodes)``);
tests/nodes/test_nodes.py runs the same sums across two simulated nodes.  Bit for bit where both
pair the same operands (one rank per node; two nodes of two consecutive ranks); within a float
sum's rounding elsewhere.
"""
import numpy as np
import pytest
from mpi4py import MPI

from cotsdl import backend
from cotsdl.array.twolevel import TwoLevel
from cotsdl.nn import Network
from cotsdl.train import GreedyTrainer, InMemorySource, Momentum
from cotsdl.train import allreduce as fused
from helpers import P, agree

#: node labels per rank count: one node, pairs of consecutive ranks, one rank each, uneven, interleaved
LAYOUTS = {1: [[0]], 2: [[0, 0], [0, 1]], 3: [[0, 0, 0], [0, 0, 1], [0, 1, 2], [1, 0, 1]],
           4: [[0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 2, 3], [0, 1, 1, 1], [0, 1, 0, 1], [5, 5, 2, 2]]}


def same_pairing(nodes):
    """Where the flat allreduce (recursive doubling / halving by rank) adds what two levels add."""
    return len(set(nodes)) == len(nodes) or nodes in ([0, 0, 1, 1], [5, 5, 2, 2])


@pytest.mark.parametrize("nodes", LAYOUTS[P], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_two_levels_equal_the_flat_allreduce(comm, nodes, dtype):
    rank = comm.Get_rank()
    two = TwoLevel(comm, nodes)
    ok = two.nodes == len(set(nodes))
    for n in (1, 2, 7, 1000, 4099):
        x = (np.random.default_rng(100 * rank + n).standard_normal(n) * 1000).astype(dtype)
        flat = x.copy()
        comm.Allreduce(MPI.IN_PLACE, flat)
        got = two.allreduce(x.copy())
        if np.issubdtype(dtype, np.integer) or same_pairing(nodes):
            ok = ok and np.array_equal(got, flat)
        else:
            eps = np.finfo(dtype).eps
            bound = (P + 1) * eps * P * np.abs(np.abs(x).max())  # |error| <= (P + 1) eps sum|terms|, roughly
            ok = ok and np.abs(got.astype(np.float64) - flat).max() <= comm.allreduce(bound, op=MPI.MAX)
    two.free()
    assert agree(comm, ok)


def test_a_two_dimensional_buffer_and_a_non_contiguous_one(comm):
    two = TwoLevel(comm, [r // 2 for r in range(P)])
    x = np.full((3, 5), comm.Get_rank() + 1.0)
    ok = np.array_equal(two.allreduce(x), np.full((3, 5), P * (P + 1) / 2))
    with pytest.raises(ValueError, match="C-contiguous"):
        two.allreduce(np.zeros((4, 4))[:, ::2])
    two.free()
    assert agree(comm, ok)


class Fake(np.ndarray):
    """Host memory that claims to be a device array (as in test_collectives.py)."""

    @property
    def __cuda_array_interface__(self):
        return {**self.__array_interface__, "version": 3}


@pytest.mark.parametrize("aware", ["0", "1"])
def test_a_device_buffer_goes_through_host_memory_once_unless_mpi_is_cuda_aware(comm, monkeypatch, aware):
    log = []
    monkeypatch.setenv("COTSDL_CUDA_AWARE_MPI", aware)
    monkeypatch.setattr(backend, "synchronize", lambda a: log.append("sync"))
    monkeypatch.setattr(backend, "empty_host_like", lambda a: np.empty(a.shape, a.dtype))
    monkeypatch.setattr(backend, "copy_to_host", lambda a, h: (log.append("down"), np.copyto(h, a.view(np.ndarray))))
    monkeypatch.setattr(backend, "copy_from_host", lambda h, a: (log.append("up"), np.copyto(a.view(np.ndarray), h)))
    monkeypatch.setattr(backend, "array_module", lambda a: np)
    two = TwoLevel(comm, [r // 2 for r in range(P)])
    buf = np.arange(6, dtype=np.float32).view(Fake) + comm.Get_rank()
    out = two.allreduce(buf)
    ok = out is buf and np.array_equal(buf.view(np.ndarray), P * np.arange(6) + P * (P - 1) / 2)
    if P > 1:
        ok = ok and log == (["sync", "down", "up"] if aware == "0" else ["sync"])
    two.free()
    assert agree(comm, ok)


def test_nodes_that_do_not_fit_are_refused_on_every_rank(comm):
    with pytest.raises(ValueError, match=f"nodes must name the node of each of the {P} rank"):
        TwoLevel(comm, [0] * (P + 1))
    if P > 1:
        with pytest.raises(ValueError, match="ranks disagree on the nodes"):
            TwoLevel(comm, [comm.Get_rank()] * P)


@pytest.mark.parametrize("nodes,want", [([0, 0, 1, 1], "two-level"), ([0, 1, 2, 3], "flat"), ([0, 0, 0, 0], "flat"),
                                        ([0, 1, 1, 1], "two-level"), ([7], "flat")])
def test_auto_chooses_two_levels_only_where_nodes_hold_several_ranks_of_several_nodes(nodes, want):
    kind, reason = fused.choose("auto", nodes)
    assert kind == want and reason.startswith("auto: ")
    assert fused.choose("flat", nodes)[0] == "flat" and fused.choose("two-level", nodes)[0] == "two-level"
    with pytest.raises(ValueError, match="reduction must be one of 'auto', 'flat', 'two-level', got 'tree'"):
        fused.choose("tree", nodes)


@pytest.mark.parametrize("setting", ["flat", "two-level", "auto"])
def test_fused_averaging_through_a_reduction(comm, setting):
    rank = comm.Get_rank()
    rng = np.random.default_rng(rank)
    grads = {"w": rng.standard_normal((5, 7)).astype(np.float32), "w_dec": rng.standard_normal(33).astype(np.float32),
             "b": rng.standard_normal(3)}
    nodes = [r // 2 for r in range(P)]
    red = fused.Reduction(comm, setting, nodes)
    want = "two-level" if setting == "two-level" or (setting == "auto" and P > 2) else "flat"
    got = fused.average(comm, grads, bucket_bytes=100, reduce=red)
    ref = fused.average(comm, grads, bucket_bytes=100)
    ok = red.kind == want and all(got[k].dtype == grads[k].dtype and got[k].shape == grads[k].shape for k in grads)
    same = np.array_equal if same_pairing(nodes) else lambda a, b: np.allclose(a, b, rtol=1e-6, atol=1e-6)
    ok = ok and all(same(got[k], ref[k]) for k in grads)
    red.free()
    assert agree(comm, ok)
    with pytest.raises(ValueError, match="reduction must be one of"):
        fused.Reduction(comm, "ring")


DESC = {"input": [12, 12, 1], "stages": [
    {"filter": {"size": [4, 4], "stride": [2, 2], "channels": 3}, "pool": {"size": [2, 2], "stride": [1, 1], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}}]}


def trained(comm, reduction):
    imgs = np.random.default_rng(0).standard_normal((32, 12, 12, 1))
    tr = GreedyTrainer(Network.from_description(DESC), InMemorySource(imgs, seed=1), Momentum(0.01, 0.9), comm=comm,
                       batch=2, replicas=P, grid=(1, 1), lam=0.2, dtype=np.float64, log_every=0, reduction=reduction)
    tr.train([4])
    out, kind = tr.gather_weights(0), tr.reduction.kind
    tr.reduction.free()
    tr.decomposition.free()
    return out, kind


def test_the_trainer_averages_replicas_alike_either_way(comm):
    """P replicas of one rank on one node: two levels (all of them the node's reduce-scatter) against flat."""
    (a, ka), (b, kb) = trained(comm, "two-level"), trained(comm, "flat")
    ok = ka == "two-level" and kb == "flat" and np.allclose(a, b, rtol=1e-12, atol=1e-14)
    assert agree(comm, ok)
    with pytest.raises(ValueError, match="reduction must be one of"):
        trained(comm, "ring")


def test_bench_reduction_measures_both_and_sizes_gradients_as_training_does(comm):
    import io  # noqa: PLC0415

    from cotsdl.array.grid import ProcessGrid  # noqa: PLC0415
    from cotsdl.array.partition import choose_grid  # noqa: PLC0415
    from cotsdl.bench import reduction  # noqa: PLC0415
    from cotsdl.nn.plan import NetworkPlan  # noqa: PLC0415

    net = Network.from_description(DESC)
    grid = ProcessGrid(comm, choose_grid(P, net.input_shape[:2]))
    plan = NetworkPlan(net, grid, 2, np.float32)
    _, box = plan.weight_box(net.filter_layers()[0])
    ok = reduction.gradient_bytes(net, 0, P, comm.Get_rank(), 4) == box.size * 4
    ok = ok and reduction.gradient_bytes(net, 0, P, comm.Get_rank(), 8, tied=False) == box.size * 16
    grid.free()
    log = io.StringIO()
    res = reduction.run(comm, [P], [("tiny", 4000), ("stage 0", lambda g, i: reduction.gradient_bytes(net, 0, g, i, 4))],
                        rounds=3, calls=1, log=log)
    rows = res["results"]
    ok = ok and [r["size"] for r in rows] == ["tiny", "stage 0"] and all(r["auto"] == "flat" for r in rows)
    ok = ok and all(r["max_abs_difference"] < 1e-5 and len(r["flat_round_s"]) == 3 for r in rows)
    ok = ok and rows[0]["bytes_per_rank_max"] == 4000 and res["nodes"][0][1] == list(range(P))
    assert agree(comm, ok)
    if comm.Get_rank() == 0:
        assert "2-level vs flat" in log.getvalue() and "stage 0" in log.getvalue()
    with pytest.raises(ValueError, match="--replicas must divide"):
        reduction.run(comm, [P + 1], [("tiny", 8)], log=log)
