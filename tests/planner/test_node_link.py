"""The link between nodes in the planner: which messages cross nodes, the node link's own alpha and
beta, and a token bucket's waits (planner/machine.py, planner/predict.py)."""
import copy

import numpy as np
import pytest

from cotsdl.cli import run
from cotsdl.planner import MachineError, load_machine, predict_step, validate_machine
from cotsdl.planner.model import Op, layer_counts
from cotsdl.planner.predict import MIN_BURST, _wire, bucket_waits


@pytest.fixture(scope="module")
def demo():
    return run.read("jobs/configs/demo.toml").network


@pytest.fixture
def machine():
    m = copy.deepcopy(load_machine("v100-ndr"))
    m["link"] = {"alpha_s": 1e-6, "beta_s_per_byte": 1e-10}
    return m


def test_node_link_is_checked_and_optional(machine):
    validate_machine(machine)  # none: fine
    for bad, match in (({"alpha_s": 1e-6}, "missing key node_link.beta_s_per_byte"),
                       ({"alpha_s": 1e-6, "beta_s_per_byte": -1}, "node_link.beta_s_per_byte = -1"),
                       ({"alpha_s": 1e-6, "beta_s_per_byte": 1e-9, "rate": 3}, "unknown key node_link.rate"),
                       ({"alpha_s": 1e-6, "beta_s_per_byte": 1e-9, "burst_bytes": -2}, "node_link.burst_bytes = -2")):
        with pytest.raises(MachineError, match=match):
            validate_machine({**machine, "node_link": bad}, "m.json")


@pytest.mark.parametrize("dims, rpn", [((2, 1), 1), ((2, 2), 2), ((2, 2), 1), ((1, 4), 2)])
def test_the_bytes_across_nodes_are_those_to_peers_on_other_nodes(demo, dims, rpn):
    counts = layer_counts(demo, 4, dims)
    G = dims[0] * dims[1]
    nodes = np.arange(G) // rpn
    machine = {"link": {"alpha_s": 0.0, "beta_s_per_byte": 0.0},
               "node_link": {"alpha_s": 0.0, "beta_s_per_byte": 1.0}}
    for c in counts:
        if not c.sent.any():
            continue
        op = Op("exchange", "forward", c.index, sent=c.sent, received=c.received)
        wire, egress = _wire(op, counts, machine, nodes)
        want = [sum(v[0] for q, v in c.peers[r].items() if nodes[q] != nodes[r]) for r in range(G)]
        assert list(egress) == want
        # beta 1 s/byte across nodes, free within: the wire time is max(sent, received) across
        got_recv = [sum(v[1] for q, v in c.peers[r].items() if nodes[q] != nodes[r]) for r in range(G)]
        assert list(wire) == [max(a, b) for a, b in zip(want, got_recv)]
        assert sum(sum(v[0] for v in p.values()) for p in c.peers) == c.sent.sum()  # every message is a peer's


def test_a_slow_link_between_nodes_slows_only_a_group_that_spans_nodes(demo, machine):
    slow = {**machine, "node_link": {"alpha_s": 1e-3, "beta_s_per_byte": 1e-7}}
    kw = dict(stage=0, dtype="float32", optimizer_slots=2)
    one_node = predict_step(demo, 32, 2, (2, 1), 1, slow, ranks_per_node=2, **kw)
    same = predict_step(demo, 32, 2, (2, 1), 1, machine, ranks_per_node=2, **kw)
    two_nodes = predict_step(demo, 32, 2, (2, 1), 1, slow, ranks_per_node=1, **kw)
    assert one_node["exchange_s"] == pytest.approx(same["exchange_s"]) and one_node["nodes"] == 1
    assert two_nodes["nodes"] == 2 and two_nodes["exchange_s"] > one_node["exchange_s"] + 1e-3
    assert two_nodes["node_egress_bytes"] > 0 and one_node["node_egress_bytes"] == 0


def test_no_bucket_waits_for_nothing():
    ops = [Op("compute", "elementwise", 0), Op("exchange", "forward", 0)]
    assert bucket_waits(ops, [1.0, 0.1], {1: 1e9}, {"link": {}}) == {}
    m = {"node_link": {"alpha_s": 1e-6, "beta_s_per_byte": 1e-9, "sustained_bytes_per_s": 1e6,
                       "burst_bytes": MIN_BURST / 2}}  # a burst this small is an unshaped link's noise
    assert bucket_waits(ops, [1.0, 0.1], {1: 1e9}, m) == {}


@pytest.mark.parametrize("send, compute, want", [
    (50e3, 0.1, 0.0),                     # within the burst, and refilled in time: the line rate
    (300e3, 0.5, (300e3 - 100e3) / 1e6),  # more than the burst each step: the rest at the sustained rate
    (80e3, 0.01, 80e3 / 1e6 - 0.011),     # within the burst, but the step refills less than it sends
])
def test_a_token_bucket_in_steady_state(send, compute, want):
    ops = [Op("compute", "elementwise", 0), Op("exchange", "forward", 0)]
    m = {"node_link": {"alpha_s": 1e-6, "beta_s_per_byte": 1e-9, "sustained_bytes_per_s": 1e6, "burst_bytes": 100e3}}
    waits = bucket_waits(ops, [compute, 0.001], {1: send}, m, passes=200)
    assert waits.get(1, 0.0) == pytest.approx(want, abs=1e-6)


def test_reductions_span_the_nodes_of_their_own_ranks(demo, machine):
    """16 ranks, 4 to a node, 4 replicas of a 2x2 grid: each model group sits on one node (its sums
    cross no node), each replicas' group spans all 4 nodes (its ring crosses them) -- though both
    groups have 4 ranks."""
    slow = {**machine, "node_link": {"alpha_s": 1.0, "beta_s_per_byte": 1e-9}}
    p = predict_step(demo, 8, 16, (2, 2), 4, slow, ranks_per_node=4, stage=0, dtype="float32", optimizer_slots=2)
    by = {op["label"]: op["seconds"] for op in p["ops"] if op["kind"] == "reduce"}
    assert by["loss terms"] < 0.01 and by["gradient over replicas"] >= 1.0, by


def test_a_burst_counts_where_the_streams_rounds_agree_on_it():
    """bench/links.py: the tbf bucket's burst agreed by its rounds; an unshaped link's jitter is no
    bucket; from 5 rounds on, one round hit by other work (either end) does not undo an agreed burst."""
    from cotsdl.bench.links import agreed_burst

    assert agreed_burst([118e3, 121e3, 119e3]) == pytest.approx(119e3)  # a 128 KB tbf bucket, three rounds
    assert agreed_burst([-40e3, 15e3, 370e3]) is None  # an unshaped veth's jitter (a CI run's 370 KB "burst")
    assert agreed_burst([118e3, 121e3, -600e3]) is None  # one bad round of three: not decided yet
    assert agreed_burst([118e3, 121e3, -600e3, 119e3, 120e3]) == pytest.approx(119e3)  # ... of five: decided
    assert agreed_burst([118e3, 121e3, 2e6, 119e3, 120e3]) == pytest.approx(120e3)
    assert agreed_burst([-40e3, 15e3, 370e3, -20e3, 300e3]) is None  # jitter stays jitter with more rounds
