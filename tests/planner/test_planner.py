"""The run planner's model: counts agree with the layers and the real plan, the machine model, the grid choice."""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cotsdl.cli import config, run
from cotsdl.nn.network import Network
from cotsdl.planner import PRESETS, MachineError, load_machine, predict_step, suggest, validate_machine
from cotsdl.planner.machine import op_seconds, rank_share
from cotsdl.planner.model import layer_counts, step_ops
from cotsdl.planner import predict as predict_mod
from cotsdl.planner.predict import RANK_COUNTS, candidates, smallest_fit

ROOT = Path(__file__).resolve().parents[2]
TINY = {"input": [13, 11, 2], "stages": [
    {"filter": {"size": [3, 3], "stride": [1, 1], "block": [2, 1], "channels": 2},
     "pool": {"size": [2, 2], "stride": [2, 2], "eps": 0.01}, "lcn": {"size": 3, "sigma": 1.0}},
    {"filter": {"size": [2, 2], "stride": [1, 1], "channels": 3},
     "pool": {"size": [2, 2], "stride": [1, 1], "eps": 0.01}, "lcn": {"size": 3, "sigma": 1.0}}]}


def tiny():
    return Network.from_description(TINY)


def demo():
    return run.read(ROOT / "tests/planner/three_stage.toml").network


def test_the_planner_imports_without_mpi():
    code = "import sys, cotsdl.planner, cotsdl.cli.plan_cmd; assert 'mpi4py.MPI' not in sys.modules, 'MPI imported'"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("net", [tiny, demo])
def test_parameters_are_the_weight_shapes(net):
    n = net()
    counts = layer_counts(n, 4, (2, 3))
    want = sum(math.prod(n.layers[i].weight_shape(n.shapes[i] + (1,))) for i in n.filter_layers())
    assert sum(c.params for c in counts) == want
    assert sum(c.params_rank.sum() for c in counts) == want  # every site on exactly one rank


@pytest.mark.parametrize("dims", [(1, 1), (2, 1), (1, 3), (2, 2), (3, 2)])
def test_rank_flops_sum_to_the_layer_and_halos_balance(dims):
    n = demo()
    counts = layer_counts(n, 5, dims)
    for c in counts:
        whole = c.layer.cost(c.in_shape)
        for p, cost in whole.items():
            assert c.passes[p][0].sum() == pytest.approx(cost.flops)
        assert c.sent.sum() == c.received.sum() and c.msgs_sent.sum() == c.msgs_received.sum()
        if dims == (1, 1):
            assert c.sent.sum() == 0 and c.msgs_sent.sum() == 0
        # every window element comes from somewhere: the rank itself or a message
        assert np.allclose(c.local + c.received, c.window_elems * 4)
        # copied only where the window is more than the owned block (else the input is the window)
        no_halo = (c.received == 0) & (c.window_elems == c.src_elems) & (c.src_elems > 0)
        assert np.array_equal(c.copied, np.where(no_halo, 0.0, c.local))
        if dims == (1, 1):
            assert c.copied.sum() == 0


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_step_flops_are_the_layer_costs_composed(stage):
    n, N = demo(), 7
    counts = layer_counts(n, N, (1, 1))
    ops = step_ops(n, counts, stage, N, 1, 4, optimizer_slots=2)
    f, p = n.layer_index(stage, "filter"), n.layer_index(stage, "pool")
    shape = lambda i: n.shapes[i] + (N,)  # noqa: E731
    want = sum(n.layers[i].cost(shape(i))["forward"].flops for i in range(f))
    cf, cp = n.layers[f].cost(shape(f)), n.layers[p].cost(shape(p))
    want += 2 * cf["forward"].flops + cf["backward_data"].flops + 2 * cf["backward_weights"].flops
    want += cp["forward"].flops + cp["backward"].flops
    got = sum(float(np.sum(op.flops)) for op in ops if op.kind == "compute" and op.what != "elementwise")
    assert got == pytest.approx(want)  # which passes and exchanges a step makes: test_step_counts.py


def test_optimizer_slots_agree_with_the_optimizers():
    """The count the planner is given (a ``RunSpec``'s, from the registry) is what each optimizer keeps."""
    from cotsdl.planner.model import UPDATE_WORK_ARRAYS
    from cotsdl.train.optim import OPTIMIZERS, from_config, slot_count

    expected = {"sgd": 0, "momentum": 1, "nesterov": 1, "adagrad": 1, "rmsprop": 1, "adam": 2, "lars": 1, "lamb": 2}
    assert set(OPTIMIZERS) == set(expected)  # a new optimizer needs its slot count checked here
    for kind in OPTIMIZERS:
        cfg = config.validate({"data": {"file": "x.h5"}, "network": {**TINY, "allow_crop": True},
                               "train": {"steps": 1, "optimizer": {"kind": kind}}, "run": {"folder": "r"}})
        opt = from_config(cfg["train"]["optimizer"], cfg["train"]["schedule"])
        assert slot_count(cfg["train"]["optimizer"]) == len(opt.slots) == expected[kind], kind
        assert run.from_config(cfg, "t.toml").train.optimizer_slots == expected[kind], kind
        opt.step({"w": np.ones(3, np.float32)}, {"w": np.ones(3, np.float32)})  # the slots it really keeps
        assert sum(len(s) for s in opt.state.values()) == expected[kind], kind
        assert opt.work_arrays <= UPDATE_WORK_ARRAYS, kind  # what the memory model counts besides the slots


def test_predict_step_api():
    m = load_machine("gtx680-fdr")
    p = predict_step(demo(), 32, 4, (2, 2), 1, m, stage=1, optimizer_slots=2)
    for k in ("seconds", "compute_s", "exchange_s", "reduce_s", "layers", "memory_bytes", "fits"):
        assert k in p
    assert p["seconds"] == pytest.approx(p["compute_s"] + p["exchange_s"] + p["reduce_s"])
    assert p["exchange_s"] > 0 and p["reduce_s"] > 0 and p["fits"]
    one = predict_step(demo(), 32, 1, (1, 1), 1, m)
    assert one["halo_bytes_per_rank_max"] == 0
    assert one["reduce_s"] == 0  # one rank: no allreduce
    # replicas add the gradient allreduce and nothing to the model grid's counts
    two = predict_step(demo(), 32, 8, (2, 2), 2, m, stage=1, optimizer_slots=2)
    assert two["reduce_s"] > p["reduce_s"] and two["compute_s"] >= p["compute_s"]
    with pytest.raises(ValueError, match="replicas"):
        predict_step(demo(), 32, 6, None, 4, m)


def test_op_time_is_the_roofline_over_the_efficiency():
    m = load_machine("h100-ndr")
    s = rank_share(m, 8)
    t = op_seconds(m, s, "filter_forward", 1e12, 1e6)
    assert t == pytest.approx(1e12 / 67e12 / m["efficiency"]["filter_forward"] + m["overhead_s"])
    t = op_seconds(m, s, "elementwise", 1e3, 1e9)
    assert t == pytest.approx(1e9 / 3.35e12 / m["efficiency"]["elementwise"] + m["overhead_s"])
    cpu = {**PRESETS["gtx680-fdr"], "kind": "cpu", "device": {**PRESETS["gtx680-fdr"]["device"], "cores": 8}}
    assert rank_share(validate_machine(cpu), 4)["flops"] == pytest.approx(3.09e12 / 4)


def test_ranks_that_outnumber_the_cores_time_share_them():
    """3 or 4 CPU ranks on 2 cores: the most crowded core sets the pace, 2 ranks on it, each with half
    of it for its FLOPs and its fixed costs per call alike (bench scaling here measured 1.3x (4 ranks)
    and 1.4x (3 ranks) the prediction that ignored the latter and averaged the cores)."""
    cpu = validate_machine({**PRESETS["gtx680-fdr"], "kind": "cpu",
                            "device": {**PRESETS["gtx680-fdr"]["device"], "cores": 2}})
    calls = lambda rpn: op_seconds(cpu, rank_share(cpu, rpn), "pool_forward", 0.0, 1.0)  # noqa: E731
    for rpn, slice_, cores in ((1, 1.0, 2), (2, 1.0, 1), (3, 2.0, 0.5), (4, 2.0, 0.5), (5, 3.0, 1 / 3)):
        assert rank_share(cpu, rpn)["slice"] == slice_
        assert rank_share(cpu, rpn)["flops"] == pytest.approx(3.09e12 / 2 * cores)
    assert calls(4) == pytest.approx(2 * calls(2), rel=1e-6)
    gpu = load_machine("gtx680-fdr")  # a GPU rank's host core is its own: no stretch
    assert rank_share(gpu, 8)["slice"] == 1.0
    four = predict_step(demo(), 32, 4, (2, 2), 1, cpu, ranks_per_node=4)
    spread = predict_step(demo(), 32, 4, (2, 2), 1, cpu, ranks_per_node=2)  # two nodes of two
    assert four["seconds"] > spread["seconds"]


def test_calibrated_refinements_per_thread_count_and_per_op_call():
    """A rank running t threads (cores / ranks per node) takes the efficiencies calibrated for t
    threads (the nearest count below), and each op its own call cost."""
    base = {**PRESETS["gtx680-fdr"], "kind": "cpu", "device": {**PRESETS["gtx680-fdr"]["device"], "cores": 4}}
    one = {k: 0.1 for k in base["efficiency"]}
    four = {k: 0.4 for k in base["efficiency"]}
    m = validate_machine({**base, "efficiency_by_threads": {"1": one, "4": four},
                          "overhead_by_op_s": {"filter_forward": 1e-4}})
    for ranks_per_node, threads, eff, slice_ in ((1, 4, 0.4, 1), (2, 2, 0.1, 1), (4, 1, 0.1, 1), (8, 1, 0.1, 2)):
        s = rank_share(m, ranks_per_node)
        assert s["threads"] == threads and s["slice"] == slice_
        t = op_seconds(m, s, "filter_forward", 1e9, 0.0)
        assert t == pytest.approx(1e9 / s["flops"] / eff + 1e-4 * slice_)
    assert op_seconds(m, rank_share(m, 1), "pool_forward", 1e9, 0.0) == pytest.approx(
        1e9 / rank_share(m, 1)["flops"] / 0.4 + m["overhead_s"])
    with pytest.raises(MachineError, match="efficiency_by_threads.2.pool_forward = 2"):
        validate_machine({**base, "efficiency_by_threads": {"2": {**one, "pool_forward": 2}}})
    with pytest.raises(MachineError, match="efficiency_by_threads.x"):
        validate_machine({**base, "efficiency_by_threads": {"x": one}})
    with pytest.raises(MachineError, match="unknown key overhead_by_op_s.conv"):
        validate_machine({**base, "overhead_by_op_s": {"conv": 1e-5}})


def test_suggestion_is_the_lowest_prediction():
    n, m = demo(), load_machine("gtx680-fdr")
    got = suggest(n, 32, 4, m, optimizer_slots=2)
    per = {}
    for r, dims in candidates(4):
        per[(r, dims)] = sum(predict_step(n, 32, 4, dims, r, m, stage=k, optimizer_slots=2)["seconds"]
                             for k in range(3)) / (32 * r)
    best = min(per.values())
    assert per[(got[0]["replicas"], tuple(got[0]["grid"]))] == pytest.approx(best)
    assert len(got) == len(per)


@pytest.mark.parametrize("tied, slots", [(True, 2), (False, 1)])
def test_the_fit_search_skips_only_rank_counts_that_cannot_fit(monkeypatch, tied, slots):
    """smallest_fit's memory bound skips rank counts before counting their halos; it must never
    skip one that fits: the answer is the one found without it, and every skipped count really
    does not fit."""
    n, m = demo(), load_machine("gtx680-fdr")
    whole = predict_step(n, 32, 1, None, 1, m, stage=0, optimizer_slots=slots, tied=tied)["memory_bytes"]
    small = dict(m, device=dict(m["device"], memory_bytes=whole / 5))  # needs a few ranks
    counts = [c for c in RANK_COUNTS if c <= 24]
    kw = dict(optimizer_slots=slots, tied=tied)
    got = smallest_fit(n, 32, small, counts=counts, **kw)
    skipped = [c for c in counts if predict_mod._cannot_fit(n, 32, c, 1, small, None, **kw)]
    monkeypatch.setattr(predict_mod, "_cannot_fit", lambda *a, **k: False)
    assert got == smallest_fit(n, 32, small, counts=counts, **kw) and got is not None
    assert skipped and got["ranks"] > max(skipped)
    assert not any(s["fits"] for c in skipped for s in suggest(n, 32, c, small, replicas=1, **kw))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid(name):
    m = load_machine(name)
    # each preset says where its efficiencies come from: measured on that GPU, or assumed
    assert m["kind"] == "gpu" and ("MEASURED" in m["source"]) == (name in ("h100-ndr", "h200-ndr")) != ("ASSUMED" in m["source"])


def test_bad_machines_name_file_and_key(tmp_path, monkeypatch):
    with pytest.raises(MachineError, match="no preset or file named 'k80'"):
        load_machine("k80")
    good = json.loads(json.dumps(PRESETS["gtx680-fdr"]))
    del good["link"]["alpha_s"]
    f = tmp_path / "m.json"
    f.write_text(json.dumps(good))
    with pytest.raises(MachineError, match=rf"{f}: missing key link.alpha_s"):
        load_machine(str(f))
    good["link"]["alpha_s"] = 1e-6
    good["efficiency"]["pool_forward"] = 1.5
    f.write_text(json.dumps(good))
    with pytest.raises(MachineError, match=r"efficiency.pool_forward = 1.5: must be a number in \(0, 1\]"):
        load_machine(str(f))
    f.write_text("{not json")
    with pytest.raises(MachineError, match="not valid JSON"):
        load_machine(str(f))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MachineError, match="machine.json"):
        load_machine("this")
    good["efficiency"]["pool_forward"] = 0.5
    (tmp_path / "machine.json").write_text(json.dumps(good))
    assert load_machine("this")["efficiency"]["pool_forward"] == 0.5


PAPER = {"185m": 185e6, "680m": 680e6, "1.9b": 1.9e9, "6.9b": 6.9e9, "11.2b": 11.2e9}


@pytest.mark.parametrize("tag", sorted(PAPER))
def test_paper_configs_have_the_stated_sizes(tag):
    n = run.read(ROOT / f"jobs/configs/paper-{tag}.toml").network
    assert n.input_shape == (200, 200, 3) and len(n.stages) == 3
    assert all(16 <= n.layers[i].size[0] <= 20 for i in n.filter_layers())
    params = sum(c.params for c in layer_counts(n, 1, (1, 1)))
    assert abs(params / PAPER[tag] - 1) < 0.05, params


@pytest.mark.parametrize("dims", [(1, 1), (2, 2)])
def test_gpu_memory_holds_backward_datas_site_products(dims, monkeypatch):
    """On a GPU a filter whose backward-data goes by sites (ops.cuda.filter.by_sites) holds that many
    whole site rows' products at once; on a CPU, and by cells, nothing."""
    from cotsdl.ops.cuda import filter as cuda_filter  # noqa: PLC0415
    from cotsdl.array.partition import grid_coords  # noqa: PLC0415
    from cotsdl.nn.layout import layout  # noqa: PLC0415
    from cotsdl.planner.model import memory  # noqa: PLC0415

    net, batch = tiny(), 4
    gpu = load_machine("gtx680-fdr")
    cpu = validate_machine({**PRESETS["gtx680-fdr"], "kind": "cpu"})
    layer = net.layers[0]
    (rh, rw), C = layer.size, net.input_shape[2]
    R = rh * rw * C
    assert cuda_filter.by_sites(*layer.stride, C) and not cuda_filter.by_sites(2, 2, 16)
    row = lambda sw: sw * R * batch * 4  # noqa: E731 - one row of site products, float32
    for budget in (cuda_filter.SITES_BUFFER_BYTES, 2 * row(11)):  # the default; two whole rows
        monkeypatch.setattr(cuda_filter, "SITES_BUFFER_BYTES", budget)
        counts = layer_counts(net, batch, dims)
        on_gpu, on_cpu = (memory(net, counts, 0, 4, 2, gpu=g)["buffers"] for g in (True, False))
        want = []
        for coords in grid_coords(dims):  # each rank's sites, in the order of the counts' arrays
            SH, SW = layout(net, dims, coords, batch)[1][0].sites.shape
            want.append(min(SH, max(1, budget // row(SW))) * row(SW))
        np.testing.assert_allclose(on_gpu - on_cpu, want)
    assert predict_step(net, batch, 1, (1, 1), 1, gpu)["memory"]["buffers"] > \
        predict_step(net, batch, 1, (1, 1), 1, cpu)["memory"]["buffers"]
    monkeypatch.setattr(cuda_filter, "CELL_ROWS", 1)  # every filter by cells: no site products held
    counts = layer_counts(net, batch, dims)
    np.testing.assert_array_equal(memory(net, counts, 0, 4, 2, gpu=True)["buffers"],
                                  memory(net, counts, 0, 4, 2, gpu=False)["buffers"])
