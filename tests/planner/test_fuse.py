"""``parallel.fuse``: the settings it takes, and what "auto" chooses on latency- and bandwidth-bound links."""
import pytest

from cotsdl.nn import Network
from cotsdl.planner import PRESETS
from cotsdl.planner.fuse import choose_fuse, resolve
from cotsdl.planner.predict import predict_step

NET = {"input": [24, 24, 1], "stages": [
    {"filter": {"size": [3, 3], "stride": [1, 1], "channels": 4}, "pool": {"size": [3, 3], "stride": [1, 1], "eps": 0.01},
     "lcn": {"size": 5, "sigma": 1.0, "eps": 1e-3}},
    {"filter": {"size": [3, 3], "stride": [1, 1], "channels": 4}, "pool": {"size": [2, 2], "stride": [2, 2], "eps": 0.01},
     "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}}]}


def machine(alpha, beta):
    return {**PRESETS["gtx680-fdr"], "name": f"a{alpha}-b{beta}", "link": {"alpha_s": alpha, "beta_s_per_byte": beta}}


def test_settings():
    assert resolve("auto", 3) is None and resolve("on", 3) == (0, 1, 2) and resolve("off", 3) == ()
    assert resolve([2, 0, 2], 3) == (0, 2)
    with pytest.raises(ValueError, match="stage 3 is not a stage"):
        resolve([3], 3)
    with pytest.raises(ValueError, match='must be "auto", "on", "off" or a list'):
        resolve("yes", 3)


def test_auto_fuses_where_messages_cost_and_not_where_bytes_do():
    net = Network.from_description(NET)
    slow_messages = choose_fuse(net, 4, 2, (2, 1), 1, machine(1e-2, 1e-15))
    assert slow_messages.stages == (0,) and "saved" in slow_messages.reasons[0]
    assert "top stage" in slow_messages.reasons[1]
    off, on = slow_messages.seconds[0]
    assert on < off and slow_messages.seconds[1] is None
    slow_bytes = choose_fuse(net, 4, 2, (2, 1), 1, machine(1e-12, 1e-6))
    assert slow_bytes.stages == () and "not above" in slow_bytes.reasons[0]
    assert choose_fuse(net, 4, 1, (1, 1), 1, machine(1, 1)).reasons[0] == "one rank per model group: no halo"
    assert "no model" in choose_fuse(net, 4, 2, (2, 1), 1, None, no_machine="no model").reasons[0]


def test_a_prediction_fuses_only_the_frozen_stages():
    """A step of stage 1 runs stage 0's pool and LCN forward: fused, the LCN's exchange is gone; the
    training stage's own pool is never fused (its LCN is not in the step)."""
    net = Network.from_description(NET)
    m = machine(1e-3, 1e-9)
    per = predict_step(net, 4, 2, (2, 1), 1, m, stage=1)
    fused = predict_step(net, 4, 2, (2, 1), 1, m, stage=1, fuse=(0, 1))
    assert fused["fuse"] == [0] and per["fuse"] == []
    lcn0 = net.layer_index(0, "lcn")
    assert [o for o in fused["ops"] if o["layer"] == lcn0 and o["kind"] == "exchange"] == []
    assert [o for o in per["ops"] if o["layer"] == lcn0 and o["kind"] == "exchange"] != []
    assert predict_step(net, 4, 2, (2, 1), 1, m, stage=0, fuse=(0, 1))["fuse"] == []
