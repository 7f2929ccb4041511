"""``parallel.overlap = "auto"``: off without halos, on where the model predicts a real gain, off below the margin."""
import json
from pathlib import Path

import pytest

from cotsdl.cli import run
from cotsdl.nn.network import Network
from cotsdl.planner import PRESETS, choose_overlap, load_machine, predict_step, validate_machine
from cotsdl.planner.overlap import MARGIN, model_machine, split_layers

ROOT = Path(__file__).resolve().parents[2]


def demo():
    return run.read(ROOT / "tests/planner/three_stage.toml").network


def machine(alpha, beta, overhead=10e-6, name="m"):
    """The gtx680-fdr preset with another link and call cost."""
    return validate_machine({**PRESETS["gtx680-fdr"], "name": name, "overhead_s": overhead,
                             "link": {"alpha_s": alpha, "beta_s_per_byte": beta}})


SLOW = machine(10e-6, 1e-9, name="slow-link")  # 1 GB/s instead of FDR's 6.8: the halo takes as long as the work
FAST = machine(1e-9, 1e-15, overhead=1e-3, name="fast-link")  # messages free, every call 1 ms


def test_off_without_halos():
    n = demo()
    for m in (SLOW, None):
        one = choose_overlap(n, 32, 1, None, 1, m)
        assert not one.on and one.reason == "1 rank, no halo to hide" and one.describe() == \
            "off (auto: 1 rank, no halo to hide)"
        reps = choose_overlap(n, 32, 4, (1, 1), 4, m)
        assert not reps.on and "1 rank per model group (4 replicas)" in reps.reason
    # fields at the stride of their size, pools too: the blocks of a 2x1 grid need no neighbour's data
    tiles = Network.from_description({"input": [8, 8, 1], "stages": [
        {"filter": {"size": [2, 2], "stride": [2, 2], "channels": 2}, "pool": {"size": [2, 2], "stride": [2, 2]},
         "lcn": {"size": 1, "sigma": 1.0}}]})
    assert split_layers(tiles, 4, (2, 1), [0]) == 0
    c = choose_overlap(tiles, 4, 2, (2, 1), 1, SLOW)
    assert not c.on and c.reason == "no layer of grid 2x1 receives halos, nothing to hide"


def test_on_where_slow_links_make_the_halo_worth_hiding():
    c = choose_overlap(demo(), 32, 4, (2, 2), 1, SLOW)
    assert c.on and c.seconds_on < (1 - MARGIN) * c.seconds_off
    assert c.reason.startswith("predicted ") and "without (halo " in c.reason and "machine slow-link" in c.reason
    assert c.describe().startswith("on (auto: predicted ")


def test_off_when_the_gain_is_below_the_margin_or_negative():
    n = demo()
    slow = choose_overlap(n, 32, 4, (2, 2), 1, SLOW)
    gain = 1 - slow.seconds_on / slow.seconds_off
    c = choose_overlap(n, 32, 4, (2, 2), 1, SLOW, margin=gain + 0.01)
    assert not c.on and f"predicted gain {gain:.1%} is below the {gain + 0.01:.0%} margin" in c.reason
    fast = choose_overlap(n, 32, 4, (2, 2), 1, FAST)  # nothing to hide, and every strip costs a call
    assert not fast.on and fast.seconds_on > fast.seconds_off and "extra calls" in fast.reason


def test_without_a_machine_the_rule_is_on_where_halos_cross_nodes():
    c = choose_overlap(demo(), 32, 2, None, 1, None, no_machine="no ./machine.json")  # where the ranks are unknown
    assert c.on and c.seconds_on is None
    assert c.reason.startswith("6 layer(s) exchange halos on grid 2x1; no ./machine.json") and \
        c.reason.endswith("the rule without a model: on where halos exist")
    for ranks, per_node in ((2, 2), (4, 8)):  # every rank on one node: halos are memory copies
        one = choose_overlap(demo(), 32, ranks, None, 1, None, ranks_per_node=per_node, no_machine="no ./machine.json")
        assert not one.on and one.seconds_on is None
        assert f"but each model group's {ranks} ranks share one node; no ./machine.json, so the rule without a " \
               "model: on only where halos cross nodes" in one.reason
    across = choose_overlap(demo(), 32, 4, None, 1, None, ranks_per_node=2, no_machine="no ./machine.json")
    assert across.on and across.reason.endswith("the rule without a model: on where halos cross nodes")
    # what the trainer knows: whether each model group is on one node, whatever the world spans
    within = choose_overlap(demo(), 32, 8, None, 2, None, ranks_per_node=4, group_on_one_node=True)
    assert not within.on and "each model group's 4 ranks share one node" in within.reason
    spread = choose_overlap(demo(), 32, 4, None, 1, None, ranks_per_node=4, group_on_one_node=False)
    assert spread.on and spread.reason.endswith("on where halos cross nodes")
    # a model decides whatever the nodes
    assert choose_overlap(demo(), 32, 4, (2, 2), 1, SLOW, ranks_per_node=4).on


def test_the_model_hides_nothing_where_nothing_is_split():
    """On one rank NetworkPlan splits no layer: overlap predicts the same step (it did not, once)."""
    n = demo()
    for m in ("gtx680-fdr", "h100-ndr"):
        on, off = (predict_step(n, 32, 1, (1, 1), 1, load_machine(m), stage=1, overlap=v) for v in (True, False))
        assert on["seconds"] == pytest.approx(off["seconds"], rel=1e-12)
    # on 4 ranks it hides the link time of what is split, never more than the exchanges cost
    on, off = (predict_step(n, 32, 4, (2, 2), 1, SLOW, stage=1, overlap=v) for v in (True, False))
    assert off["seconds"] - off["exchange_s"] < on["seconds"] < off["seconds"]


def test_the_model_machine_is_this_machines_calibration(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    m, why = model_machine()
    assert m is None and why.startswith("no ./machine.json") and "cotsdl bench calibrate" in why
    (tmp_path / "machine.json").write_text("{")
    m, why = model_machine()
    assert m is None and why.startswith("machine machine.json: not valid JSON")
    (tmp_path / "machine.json").write_text(json.dumps(SLOW))
    m, why = model_machine()
    assert m["name"] == "slow-link" and why == ""
