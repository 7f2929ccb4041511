"""``parallel.fuse``: the settings it takes, and what "auto" chooses on latency- and bandwidth-bound links."""
import pytest

from cotsdl.nn import Network
from cotsdl.planner import PRESETS
from cotsdl.planner.fuse import choose_fuse, resolve, resolve_filter
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
    """Pool and LCN only (``parallel.fuse_filter = "off"``): fused where messages cost, not where bytes do."""
    net = Network.from_description(NET)
    slow_messages = choose_fuse(net, 4, 2, (2, 1), 1, machine(1e-2, 1e-15), filters=())
    assert slow_messages.stages == (0,) and "saved" in slow_messages.reasons[0]
    assert "top stage" in slow_messages.reasons[1]
    off, on = slow_messages.seconds[0]
    assert on < off and slow_messages.seconds[1] is None
    slow_bytes = choose_fuse(net, 4, 2, (2, 1), 1, machine(1e-12, 1e-6), filters=())
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


def test_filter_settings():
    assert resolve_filter("auto", 3, (0,)) is None and resolve_filter("off", 3, None) == ()
    assert resolve_filter("on", 3, None) == "on" and resolve_filter("on", 3, (0, 2)) == (0, 2)
    assert resolve_filter([1], 3, None) == (1,) and resolve_filter([2], 3, (0, 2)) == (2,)
    with pytest.raises(ValueError, match="parallel.fuse_filter: stage 1's filter joins its pool and LCN only where "
                                         "they are fused; parallel.fuse fuses \\[0\\]"):
        resolve_filter([0, 1], 3, (0,))
    with pytest.raises(ValueError, match='parallel.fuse_filter must be "auto", "on", "off" or a list'):
        resolve_filter("sometimes", 3, None)
    with pytest.raises(ValueError, match="parallel.fuse_filter: stage 4 is not a stage"):
        resolve_filter([4], 3, None)


def test_auto_fuses_the_filter_of_a_frozen_stage_by_the_predicted_step():
    """The three forms of stage 0 (a 1-channel input, a 4-channel filter output): where bytes cost, the
    stage's input (one channel) is the cheaper halo than the filter's output, so filter+pool+LCN wins;
    where compute costs and the link is free, the filter's redundant outputs lose; fixed settings
    leave only their forms."""
    net = Network.from_description(NET)
    slow_bytes = choose_fuse(net, 4, 2, (2, 1), 1, machine(1e-12, 1e-6))
    assert slow_bytes.stages == (0,) and slow_bytes.filters == (0,)
    assert "filter+pool+LCN" in slow_bytes.reasons[0] and "fused with its filter" in slow_bytes.describe()
    pred = slow_bytes.predicted[0]
    assert pred["filter+pool+LCN"] < pred["per layer"] and set(pred) == {"per layer", "pool+LCN", "filter+pool+LCN"}
    slow_compute = {**machine(1e-12, 1e-15), "name": "slow-compute"}
    slow_compute["efficiency"] = {k: v * 1e-3 for k, v in slow_compute["efficiency"].items()}
    free_link = choose_fuse(net, 4, 2, (2, 1), 1, slow_compute)
    assert free_link.filters == (), free_link.describe()
    assert choose_fuse(net, 4, 2, (2, 1), 1, machine(1e-12, 1e-6), fused=(0,), filters=()).filters == ()
    forced = choose_fuse(net, 4, 2, (2, 1), 1, slow_compute, fused=(0,), filters="on")
    assert (forced.stages, forced.filters, forced.reasons[0]) == ((0,), (0,), "given")
    assert choose_fuse(net, 4, 2, (2, 1), 1, machine(1e-12, 1e-6), filters=(1,)).filters == (1,)


def test_a_prediction_fuses_the_frozen_filters_only():
    """A step of stage 1 with stage 0's filter fused: one exchange for stage 0 (its filter's, on the grown
    window), more filter FLOPs, the weight halo in memory once; the training stage is as before."""
    net = Network.from_description(NET)
    m = machine(1e-3, 1e-9)
    pool = predict_step(net, 4, 2, (2, 1), 1, m, stage=1, fuse=(0,))
    whole = predict_step(net, 4, 2, (2, 1), 1, m, stage=1, fuse=(0, 1), fuse_filter=(0, 1))
    assert whole["fuse_filter"] == [0] and pool["fuse_filter"] == []
    stage0 = [net.layer_index(0, k) for k in ("filter", "pool", "lcn")]
    ex = [o["layer"] for o in whole["ops"] if o["layer"] in stage0 and o["kind"] == "exchange"]
    assert ex == [stage0[0]]
    lay = {l["index"]: l for l in whole["layers"]}
    lay_pool = {l["index"]: l for l in pool["layers"]}
    assert lay[stage0[0]]["flops_per_rank_max"] > lay_pool[stage0[0]]["flops_per_rank_max"]
    halo = whole["weight_halo"]
    assert halo["bytes_kept"] > 0 and halo["messages_fetched"] >= 1 and pool["weight_halo"]["bytes_kept"] == 0
    assert whole["memory"]["weights"] == pytest.approx(pool["memory"]["weights"] + halo["bytes_kept"])
    for a, b in zip(whole["layers"][3:], pool["layers"][3:]):  # the training stage's layers
        assert a["halo_bytes_per_rank_max"] == b["halo_bytes_per_rank_max"]
