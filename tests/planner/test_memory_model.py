"""The planner's memory model counts what a rank holds, by category, and its per-op model takes an
efficiency at the op's size (README, "The paper's smallest network on this machine's CPUs").

The categories are pinned here, not the numbers: those are measured against real runs
(``jobs/paper-185m-cpu.sh``; ``tests/train/test_paper_shape.py`` holds one stage to bounds).
"""
import copy

import numpy as np
import pytest

from cotsdl.nn import Network
from cotsdl.planner import load_machine, predict_step, validate_machine
from cotsdl.planner.machine import MachineError, efficiency, rank_share
from cotsdl.planner.model import (DEVICE_CATEGORIES, HOST_CATEGORIES, NORM_WORDS, PROCESS_BYTES, READ_WORDS,
                                  UPDATE_WORDS, UPDATE_WORK_ARRAYS, layer_counts, memory, runtime_bytes, step_ops)

NET = {"input": [24, 24, 3], "stages": [
    {"filter": {"size": [6, 6], "stride": [2, 2], "block": [2, 2], "channels": 2},
     "pool": {"size": [2, 2], "stride": [2, 2], "eps": 0.01}, "lcn": {"size": 3, "sigma": 1.0, "eps": 0.01}},
    {"filter": {"size": [3, 3], "stride": [1, 1], "channels": 4},
     "pool": {"size": [2, 2], "stride": [1, 1], "eps": 0.01}, "lcn": {"size": 3, "sigma": 1.0, "eps": 0.01}}]}


def cpu_machine(**extra):
    m = copy.deepcopy(load_machine("gtx680-fdr"))
    m.update(kind="cpu", name="test-cpu", **extra)
    m["device"].update(cores=2, devices_per_node=1, memory_bytes=16 * 2**30)
    return validate_machine(m)


@pytest.mark.parametrize("stage, slots, tied", [(0, 1, True), (1, 2, True), (0, 1, False)])
@pytest.mark.parametrize("dims", [(1, 1), (2, 1)])
def test_a_cpu_rank_holds_every_category(stage, slots, tied, dims):
    net = Network.from_description(NET)
    counts = layer_counts(net, 8, dims, 4)
    f = net.layer_index(stage, "filter")
    copies = 1 if tied else 2
    mem = memory(net, counts, stage, 4, slots, tied, gpu=False, runtime=1e8)
    w = counts[f].params_rank * 4
    assert set(DEVICE_CATEGORIES + HOST_CATEGORIES) <= set(mem)
    for k in DEVICE_CATEGORIES + HOST_CATEGORIES:
        if k != "buffers" or dims != (1, 1):  # one rank: no halo
            assert np.all(mem[k] > 0), k
    np.testing.assert_allclose(mem["total"], sum(mem[k] for k in DEVICE_CATEGORIES + HOST_CATEGORIES))
    np.testing.assert_allclose(mem["optimizer"], w * (slots + UPDATE_WORK_ARRAYS) * copies)
    # a checkpoint's shard: every layer's weights and the stage's optimizer slots, built in memory
    all_weights = sum(c.params_rank for c in counts) * 4 * copies
    np.testing.assert_allclose(mem["temporaries"], all_weights + w * slots * copies)
    np.testing.assert_allclose(mem["diagnostics"], w)  # the stage's initial weights (encoder)
    np.testing.assert_allclose(mem["reader"], 2 * counts[0].src_elems * 4)  # read ahead, and its copy
    np.testing.assert_allclose(mem["runtime"], 1e8)
    # per layer, the categories of the layers add up to all but the runtime
    by_layer = sum(sum(v for v in d.values()) for d in mem["by_layer"].values())
    np.testing.assert_allclose(by_layer + mem["runtime"], mem["total"])


def test_a_gpu_counts_its_device_only():
    net = Network.from_description(NET)
    counts = layer_counts(net, 8, (2, 1), 4)
    gpu = memory(net, counts, 0, 4, 1, gpu=True, runtime=1e8)
    for k in HOST_CATEGORIES:  # host memory: not the device's
        assert np.all(gpu[k] == 0), k
    np.testing.assert_allclose(gpu["temporaries"], counts[0].params_rank * 4)  # the norm projection's squares
    np.testing.assert_allclose(gpu["total"], sum(gpu[k] for k in DEVICE_CATEGORIES))


def test_the_runtime_is_the_machines():
    net = Network.from_description(NET)
    measured = cpu_machine(process_bytes=123 << 20)
    assert runtime_bytes(measured) == 123 << 20
    assert runtime_bytes(cpu_machine()) == PROCESS_BYTES  # older calibrations: the default
    assert runtime_bytes(load_machine("h100-ndr")) == 0
    p = predict_step(net, 8, 2, (2, 1), 1, measured, stage=0, optimizer_slots=1)
    assert p["memory"]["runtime"] == 123 << 20
    assert p["memory_bytes"] == pytest.approx(sum(p["memory"][k] for k in DEVICE_CATEGORIES + HOST_CATEGORIES))
    with pytest.raises(MachineError, match="process_bytes"):
        cpu_machine(process_bytes=-1)


def by_size_machine():
    effs = lambda v: {k: v for k in ("filter_forward", "filter_backward_data", "filter_backward_weights",  # noqa: E731
                                     "pool_forward", "pool_backward", "lcn_forward", "lcn_backward", "elementwise")}
    return cpu_machine(efficiency_by_threads={"1": effs(0.5), "2": effs(0.5)}, efficiency_by_size=[
        {"case": "small", "bytes": effs(1e6), "by_threads": {"1": effs(1.2), "2": effs(0.9)}},
        {"case": "large", "bytes": effs(1e8), "by_threads": {"1": effs(0.4), "2": effs(0.3)}}])


def test_an_ops_efficiency_is_taken_at_its_size():
    m = by_size_machine()
    one, two = rank_share(m, 2), rank_share(m, 1)  # a rank per core: 1 thread; one rank: 2 threads
    assert one["threads"] == 1 and two["threads"] == 2
    op = "filter_forward"
    assert efficiency(m, one, op, 1e3) == 1.2 and efficiency(m, one, op, 1e6) == 1.2  # the smallest case below it
    assert efficiency(m, one, op, 1e9) == 0.4 and efficiency(m, two, op, 1e9) == 0.3  # the largest above it
    assert efficiency(m, one, op, 1e7) == pytest.approx(0.8)  # halfway in log(bytes)
    assert efficiency(m, one, op) == 0.5  # no size: efficiency_by_threads
    plain = cpu_machine()
    assert efficiency(plain, one, op, 1e7) == plain["efficiency"][op]


def test_efficiency_by_size_is_checked():
    m = by_size_machine()
    bad = copy.deepcopy(m)
    del bad["efficiency_by_size"][0]["bytes"]["lcn_forward"]
    with pytest.raises(MachineError, match=r"efficiency_by_size\[0\]\.bytes\.lcn_forward"):
        validate_machine(bad)
    bad = copy.deepcopy(m)
    bad["efficiency_by_size"][1]["by_threads"]["x"] = {}
    with pytest.raises(MachineError, match="thread counts"):
        validate_machine(bad)
    with pytest.raises(MachineError, match="must be a list"):
        validate_machine({**m, "efficiency_by_size": {}})


def by_shape_machine():
    m = by_size_machine()
    m["efficiency_by_shape"] = [
        {"shape": "filter 6x6 stride 2x2 block 2x2 K=2 C=3 N=8", "case": "a", "bytes": _ops3(1e6),
         "by_threads": {"1": _ops3(0.25)}},
        {"shape": "filter 6x6 stride 2x2 block 2x2 K=2 C=3 N=8", "case": "b", "bytes": _ops3(1e8),
         "by_threads": {"1": _ops3(0.05)}}]
    return validate_machine(m)


def _ops3(v):
    return {k: v for k in ("filter_forward", "filter_backward_data", "filter_backward_weights")}


def test_an_ops_efficiency_is_taken_from_its_own_layer_shape_first():
    """A pass's speed depends on its shape (a backward-weights pass reduces over the batch): entries of
    the op's layer shape win over the cases by size, interpolated at its bytes among themselves."""
    m = by_shape_machine()
    one = rank_share(m, 2)
    net = Network.from_description(NET)
    shape = net.pass_shape(0, 8)
    assert shape == "filter 6x6 stride 2x2 block 2x2 K=2 C=3 N=8"
    assert efficiency(m, one, "filter_forward", 1e5, shape) == 0.25
    assert efficiency(m, one, "filter_forward", 1e7, shape) == pytest.approx(0.15)  # halfway in log(bytes)
    assert efficiency(m, one, "filter_forward", 1e7, net.pass_shape(0, 16)) == pytest.approx(0.8)  # by size
    assert efficiency(m, one, "pool_forward", 1e7, net.pass_shape(1, 8)) == pytest.approx(0.8)
    # the planner passes each layer pass its shape: the same step, slower where the shape says so
    fast = predict_step(net, 8, 1, (1, 1), 1, by_size_machine())
    slow = predict_step(net, 8, 1, (1, 1), 1, m)
    t = lambda p, what: sum(o["seconds"] for o in p["ops"] if o["what"] == what and o["layer"] == 0)  # noqa: E731
    assert t(slow, "filter_forward") > t(fast, "filter_forward") and t(slow, "filter_backward_weights") > t(
        fast, "filter_backward_weights")
    assert [o["seconds"] for o in slow["ops"] if o["what"].startswith("pool")] == \
        [o["seconds"] for o in fast["ops"] if o["what"].startswith("pool")]


def test_every_layer_kind_has_its_own_shape():
    net = Network.from_description(NET)
    shapes = [net.pass_shape(i, 4) for i in range(len(net.layers))]
    assert [s.split()[0] for s in shapes] == ["filter", "pool", "lcn"] * 2
    assert len(set(shapes)) == 6 and all(s.endswith(" N=4") for s in shapes)
    assert net.pass_shape(1, 4) == "pool 2x2 stride 2x2 C=2 N=4" and net.pass_shape(3, 4).endswith("K=4 C=2 N=4")


@pytest.mark.parametrize("edit, match", [
    (lambda e: e.update(shape="conv 3x3"), r"efficiency_by_shape\[0\]\.shape = 'conv 3x3'"),
    (lambda e: e["bytes"].pop("filter_backward_weights"), r"efficiency_by_shape\[0\]\.bytes\.filter_backward_weights"),
    (lambda e: e["by_threads"]["1"].update(filter_forward=-1), r"efficiency_by_shape\[0\]\.by_threads\.1\.filter_forward"),
    (lambda e: e.pop("bytes"), r"efficiency_by_shape\[0\] must be an object"),
])
def test_efficiency_by_shape_is_checked(edit, match):
    bad = copy.deepcopy(by_shape_machine())
    edit(bad["efficiency_by_shape"][0])
    with pytest.raises(MachineError, match=match):
        validate_machine(bad)
    with pytest.raises(MachineError, match="must be a list"):
        validate_machine({**by_shape_machine(), "efficiency_by_shape": {}})


def test_the_step_counts_the_update_the_norm_projection_and_the_reader():
    """The update's words are the optimizer's (every slot count of the registry has its count); the
    norm projection and the read of the next minibatch are ops of the step."""
    from cotsdl.train.optim import OPTIMIZERS, slot_count

    for kind in OPTIMIZERS:
        assert slot_count({"kind": kind}) in UPDATE_WORDS, kind
    net = Network.from_description(NET)
    counts = layer_counts(net, 8, (1, 1), 4)
    for slots in (0, 1, 2):
        ops = {op.label: op for op in step_ops(net, counts, 0, 8, 1, 4, slots)}
        w = counts[0].params_rank
        np.testing.assert_allclose(ops[f"update ({slots} optimizer slot(s))"].flops, w * UPDATE_WORDS[slots])
        np.testing.assert_allclose(ops["filter norms and their projection"].flops, w * NORM_WORDS)
        read = next(op for label, op in ops.items() if label.startswith("the next minibatch"))
        np.testing.assert_allclose(read.bytes, counts[0].src_elems * READ_WORDS * 4)
