"""Predicted step time and memory of a training step on a machine; the best grid for P ranks.

The step is a sequence of operations (:func:`cotsdl.planner.model.step_ops`); ranks
synchronize at every exchange and allreduce, so the step time is the sum over the
operations of the slowest rank's time for each (a bulk-synchronous bound):

- compute: :func:`~cotsdl.planner.machine.op_seconds` (roofline / efficiency + overhead);
- exchange: ``alpha * max(messages sent, received) + beta * max(bytes sent, received)``
  plus packing, unpacking and the local copy at the rank's memory bandwidth, plus one
  overhead (messages to different peers travel at once, sharing the rank's link);
- small allreduce over n ranks: ``ceil(log2 n) * (alpha + bytes * beta)`` (recursive doubling);
  the replicas' gradient allreduce: a ring, ``2 (n-1) alpha + 2 (n-1)/n * bytes * beta``.

With ``overlap`` an exchange's wire time (``alpha * messages + beta * bytes``) hides behind
the computation that runs while its messages travel (``Op.hides``), the two counting as
the larger on each rank: a forward exchange behind its layer's interior, on the ranks
where ``NetworkPlan`` splits the layer (halos arrive and the interior is not empty:
``LayerCounts.strips``), which then pays one more call per border strip; the decoder's
and the pool's sums behind the objective's ``meanwhile`` work.  Packing, unpacking and
the local copy are the rank's own memory traffic and stay.  The exchanges and the
computation shorten by what that saves the slowest rank of the two together (ranks that
only send gain nothing); where no messages travel overlap changes nothing.  A bound: the
wire time hides only where MPI moves the messages while the rank computes.
:func:`cotsdl.planner.overlap.choose_overlap` turns the two predictions into
``parallel.overlap = "auto"``'s decision.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Any, Sequence

import numpy as np

from ..array.partition import _divisor_pairs
from ..nn.network import Network
from .machine import (call_seconds, default_ranks_per_node, link_of, message_seconds, op_seconds, rank_share,
                      sustained_rate)
from .model import Op, layer_counts, memory, runtime_bytes, step_ops
from .reduction import choose as choose_reduction

_COUNTS_CACHE: dict[tuple, list] = {}


def counts_for(network: Network, batch: int, dims: Sequence[int], itemsize: int, fuse: Sequence[int] = (),
               fuse_filter: Sequence[int] = ()):
    """:func:`layer_counts`, remembered per (network, batch, grid, itemsize, fused stages and filters):
    machines do not change them."""
    fuse, fuse_filter = (tuple(sorted(int(k) for k in v)) for v in (fuse, fuse_filter))
    key = (repr(network.describe()), int(batch), tuple(int(d) for d in dims), int(itemsize), fuse, fuse_filter)
    if key not in _COUNTS_CACHE:
        if len(_COUNTS_CACHE) > 64:
            _COUNTS_CACHE.clear()
        _COUNTS_CACHE[key] = layer_counts(network, batch, dims, itemsize, fuse, fuse_filter)
    return _COUNTS_CACHE[key]


def _wire(op: Op, counts: list, machine: dict[str, Any], nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per rank: the exchange's wire time, its bytes sent to other nodes).  Messages to ranks of the
    same node travel on ``link``, the others on ``node_link``, one after the other (a bound: on a CPU
    node both kinds are moved by the same cores)."""
    c = counts[op.layer]
    G = len(c.sent)
    within, across = np.zeros((4, G)), np.zeros((4, G))  # bytes sent, received, messages sent, received
    for r, peers in enumerate(c.peers):
        for q, v in peers.items():
            sb, rb, sm, rm = v if op.what == "forward" else (v[1], v[0], v[3], v[2])  # the adjoint reverses
            (across if nodes[q] != nodes[r] else within)[:, r] += (sb, rb, sm, rm)
    wire = message_seconds(machine, np.maximum(within[2], within[3]), np.maximum(within[0], within[1]))
    wire = wire + message_seconds(machine, np.maximum(across[2], across[3]), np.maximum(across[0], across[1]),
                                  across=True)
    return wire, across[0]


#: A burst below this is no token bucket: an unshaped link's estimate scatters around 0 (a stream's
#: jitter moves it by tens of KiB on a fast link); the tbf buckets measured here were 61-120 KiB.
MIN_BURST = 32 << 10


def bucket_waits(ops: list[Op], times: list[float], sends: dict[int, float], machine: dict[str, Any],
                 passes: int = 8) -> dict[int, float]:
    """Seconds each op that sends across nodes waits for a token bucket (``node_link``'s sustained rate
    and burst), in a steady state of steps.

    The bucket fills at the sustained rate while the step runs, up to the burst; an op sends its bytes
    at the line rate while the bucket holds them, and waits for the rest at the sustained rate.  The
    step is walked until the bucket's level at its start repeats.  A link without a bucket (a real
    network: no burst worth the name) waits for nothing: its line rate is its sustained rate."""
    node = machine.get("node_link") or {}
    rate, burst = node.get("sustained_bytes_per_s"), node.get("burst_bytes", 0.0)
    if not rate or burst < MIN_BURST or not any(sends.values()):
        return {}
    level, waits = burst, {}
    for _ in range(passes):
        start, waits = level, {}
        for i, t in enumerate(times):
            need = sends.get(i, 0.0)
            if need > level:  # what the bucket lacks comes at the sustained rate (those tokens are spent)
                waits[i] = (need - level) / rate
                level = 0.0
            else:
                level -= need
            level = min(burst, level + rate * t)
        if abs(level - start) <= 1e-6 * burst:
            break
    return waits


def _spans(ranks: Sequence[int], rpn: int) -> int:
    """How many nodes ``ranks`` (world ranks, packed ``rpn`` to a node) sit on."""
    return len({int(r) // rpn for r in ranks})


def _op_seconds(op: Op, machine: dict[str, Any], share: dict[str, float], wire=None,
                nodes_of_group: int = 1, levels: tuple[int, int] | None = None,
                shape: str | None = None) -> np.ndarray | float:
    """One op's time per rank (``wire``: an exchange's from :func:`_wire`; ``nodes_of_group``: how many
    nodes a reduction's group spans; ``levels``: (its ranks per node, its nodes) where the replicas'
    gradient goes in two levels, :mod:`cotsdl.train.allreduce`; ``shape``: a layer pass's shape)."""
    if op.kind == "compute":
        fl, by = np.broadcast_arrays(np.asarray(op.flops, float), np.asarray(op.bytes, float))
        return np.array([op_seconds(machine, share, op.what, a, b, shape=shape) for a, b in zip(fl.ravel(), by.ravel())])
    if op.kind == "exchange":
        if wire is None:
            wire = message_seconds(machine, np.maximum(op.msgs_sent, op.msgs_received), np.maximum(op.sent, op.received))
        pack = (op.sent + op.received + op.local) / share["bandwidth"]
        return wire + pack + call_seconds(machine, None, share)
    n = op.group
    if n <= 1:
        return 0.0
    nbytes = np.asarray(op.bytes, float)
    across = nodes_of_group > 1
    if op.label == "gradient over replicas" and levels is not None:  # reduce, leaders' ring, broadcast
        per, nodes = levels
        node = link_of(machine, True)
        return (2 * math.ceil(math.log2(per)) * message_seconds(machine, 1, nbytes) + 2 * (nodes - 1) * node["alpha_s"]
                + 2 * (nodes - 1) / nodes * nbytes * node["beta_s_per_byte"])
    if op.label == "gradient over replicas":  # large: ring allreduce, as slow as its slowest hop
        link = link_of(machine, across)
        return 2 * (n - 1) * link["alpha_s"] + 2 * (n - 1) / n * nbytes * link["beta_s_per_byte"]
    # recursive doubling: the hops between nodes on node_link, the rest within a node
    hops_across = math.ceil(math.log2(nodes_of_group)) if across else 0
    hops = max(math.ceil(math.log2(n)), hops_across)
    return (hops - hops_across) * message_seconds(machine, 1, nbytes) + hops_across * message_seconds(
        machine, 1, nbytes, across=True)


def _overlapped(ops: list[Op], per_rank: list[np.ndarray], times: list[float], counts: list,
                machine: dict[str, Any], share: dict[str, float], wires: dict[int, np.ndarray]) -> list[float]:
    """The op times with overlap.  Each computation that runs while messages travel (``Op.hides``)
    and those exchanges form a phase; on each rank the phase loses the wire time hidden (the two
    count as the larger) and gains a call per border strip of a split forward.  The phase then
    takes the slowest rank's time less the gain: the exchanges lose it (in proportion), or the
    computation pays the loss."""
    out = list(times)
    for j, comp in enumerate(ops):
        if not comp.hides:
            continue
        exch = sum(per_rank[i] for i in comp.hides)
        before = exch + per_rank[j]
        work = per_rank[j]
        for i in comp.hides:
            ex = ops[i]
            wire = wires[i]
            # a forward overlaps where NetworkPlan splits the layer; the objective's meanwhile work always
            strips = counts[ex.layer].strips if ex.what == "forward" else 0.0
            where = strips > 0 if ex.what == "forward" else True
            exch = np.where(where, exch - wire, exch)
            work = np.where(where, np.maximum(work, wire) + strips * call_seconds(machine, comp.what, share), work)
        gain = float(np.max(before) - np.max(exch + work))
        exchanges = sum(out[i] for i in comp.hides)
        if gain > 0 and exchanges > 0:  # gain <= the wire time <= the exchanges' time
            for i in comp.hides:
                out[i] *= max(0.0, 1 - gain / exchanges)
        elif gain < 0:
            out[j] -= gain
    return out


def predict_step(network: Network, batch: int, ranks: int, dims: Sequence[int] | None, replicas: int,
                 machine: dict[str, Any], stage: int = 0, dtype: str = "float32", optimizer_slots: int = 2,
                 ranks_per_node: int | None = None, tied: bool = True, overlap: bool = False,
                 reduction: str = "auto", fuse: Sequence[int] = (), fuse_filter: Sequence[int] = ()) -> dict[str, Any]:
    """Predicted time and memory of one training step of ``stage``.

    Parameters
    ----------
    network : Network
    batch : int
        Images per replica per step.
    ranks : int
        All ranks (``replicas * Py * Px``).
    dims : (Py, Px) or None
        The model grid (None: ``choose_grid`` for ``ranks // replicas``, as training does).
    machine : dict
        A validated machine (:func:`cotsdl.planner.load_machine`).
    reduction : "auto", "flat" or "two-level"
        ``parallel.reduction``: the replicas' gradient sum is predicted as the one it chooses for
        the replicas' group of the first grid position (``result["reduction"]``).
    fuse : stage indices
        ``parallel.fuse``: stages whose pool and LCN share one exchange (``NetworkPlan(fuse=...)``);
        a step fuses those below ``stage`` (its frozen forward), ``result["fuse"]``.
    fuse_filter : stage indices
        ``parallel.fuse_filter`` (a subset of ``fuse``): fused stages whose filter joins them below
        ``stage`` (one exchange of the stage's input; ``NetworkPlan(fuse_filter=...)``),
        ``result["fuse_filter"]``; their weight halo's one fetch is ``result["weight_halo"]`` (not per step).

    Returns
    -------
    dict
        ``seconds`` (the step), ``compute_s``, ``exchange_s``, ``reduce_s``, ``memory_bytes``
        (the largest rank's), ``memory`` (by category, largest rank), ``device_memory_bytes``,
        ``fits``, ``flops`` and ``halo_bytes`` (per rank, largest), ``layers`` (per-layer
        detail) and ``ops`` (every operation with its time).
    """
    from ..array.partition import choose_grid  # noqa: PLC0415

    ranks, replicas, batch = int(ranks), int(replicas), int(batch)
    if replicas < 1 or ranks < 1 or ranks % replicas:
        raise ValueError(f"replicas must be a positive divisor of ranks {ranks}, got {replicas}")
    group = ranks // replicas
    dims = tuple(int(d) for d in dims) if dims is not None else choose_grid(group, network.input_shape[:2])
    if len(dims) != 2 or dims[0] * dims[1] != group:
        raise ValueError(f"grid {dims[0]}x{dims[1]} has {dims[0] * dims[1]} ranks; {ranks} ranks over {replicas} "
                         f"replica(s) need {group} per grid")
    itemsize = np.dtype(dtype).itemsize
    rpn = int(ranks_per_node) if ranks_per_node else default_ranks_per_node(machine, ranks)
    share = rank_share(machine, rpn)
    fuse = tuple(sorted(int(k) for k in fuse if int(k) < int(stage)))  # the training stage's pool runs alone
    fuse_filter = tuple(sorted(int(k) for k in fuse_filter if int(k) < int(stage)))
    counts = counts_for(network, batch, dims, itemsize, fuse, fuse_filter)
    ops = step_ops(network, counts, stage, batch, replicas, itemsize, optimizer_slots, tied)
    # where the ranks are: the model group's ranks 0..G-1 (replica 0) packed rpn to a node
    nodes = np.arange(group) // rpn
    wires, wires_egress, egress = {}, {}, np.zeros(group)
    for i, op in enumerate(ops):
        if op.kind == "exchange":
            wires[i], wires_egress[i] = _wire(op, counts, machine, nodes)
            egress += wires_egress[i]
    # the nodes each reduction's ranks span: the replicas' (one rank of every model group), the whole
    # world's, or the model group's (by the op's label first: the sizes may coincide)
    over_replicas = _spans(range(0, group * replicas, group), rpn)
    by_size = {group: _spans(range(group), rpn), group * replicas: _spans(range(group * replicas), rpn)}

    def spanned(op: Op) -> int:
        return over_replicas if op.label.endswith("over replicas") else by_size.get(op.group, 1)

    # the replicas' group of grid position 0 (world ranks 0, G, 2G, ...): flat or two levels (as trained)
    on_nodes = [k * group // rpn for k in range(replicas)]
    kind = choose_reduction(reduction, on_nodes)[0]
    levels = (max(Counter(on_nodes).values()), len(set(on_nodes))) if kind == "two-level" else None
    def shape(op: Op) -> str | None:  # a layer's own pass (not the elementwise work beside it)
        return network.pass_shape(op.layer, batch) if op.kind == "compute" and op.layer is not None \
            and op.what != "elementwise" else None

    per_rank = [np.broadcast_to(_op_seconds(op, machine, share, wires.get(i), spanned(op), levels, shape(op)),
                                (len(counts[0].sent),)) for i, op in enumerate(ops)]
    times = [float(np.max(t)) for t in per_rank]
    if overlap:
        times = _overlapped(ops, per_rank, times, counts, machine, share, wires)
    tot = {k: float(sum(t for t, op in zip(times, ops) if op.kind == k)) for k in ("compute", "exchange", "reduce")}
    # What the busiest node sends to other nodes, op by op: the exchanges' bytes across nodes, and the
    # replicas' ring (2 (n-1)/n of the gradient per rank) where it spans nodes.
    busiest = int(np.argmax(np.bincount(nodes, weights=egress))) if len(nodes) else 0
    sends = {}
    for i, op in enumerate(ops):
        if i in wires:
            sends[i] = float(np.sum(wires_egress[i][nodes == busiest]))
        elif op.label == "gradient over replicas" and spanned(op) > 1:
            # flat: every rank of the node in a ring; two levels: each of the node's groups once, by its leader
            n, per = (op.group, 1) if levels is None else (levels[1], levels[0])
            sends[i] = float(np.max(np.asarray(op.bytes, float))) * 2 * (n - 1) / n * min(rpn, group) / per
    waits = bucket_waits(ops, times, sends, machine)
    for i, w in waits.items():
        times[i] += w
    tot = {k: float(sum(t for t, op in zip(times, ops) if op.kind == k)) for k in ("compute", "exchange", "reduce")}
    node_egress = float(sum(sends.values()))
    link_bound = float(sum(waits.values()))
    mem = memory(network, counts, stage, itemsize, optimizer_slots, tied, gpu=machine["kind"] == "gpu",
                 runtime=runtime_bytes(machine))
    worst = int(np.argmax(mem["total"]))
    layers = []
    for c in counts:
        mine = [(op, t) for op, t in zip(ops, times) if op.layer == c.index]
        flops = sum(np.asarray(op.flops, float) for op, _ in mine if op.kind == "compute") + np.zeros(len(c.sent))
        halo = [(op.received, op.msgs_sent + op.msgs_received) for op, _ in mine if op.kind == "exchange"]
        hb = sum(np.asarray(h, float) for h, _ in halo) + np.zeros(len(c.sent))
        hm = sum(np.asarray(m, float) for _, m in halo) + np.zeros(len(c.sent))
        layers.append({
            "index": c.index, "stage": c.stage, "kind": c.kind, "in_shape": list(c.in_shape),
            "out_shape": list(c.out_shape), "params": int(c.params), "params_per_rank_max": int(c.params_rank.max()),
            "flops_per_rank_max": float(flops.max()), "flops_total": float(flops.sum()),
            "halo_bytes_per_rank_max": float(hb.max()), "halo_messages_per_rank_max": int(hm.max()),
            "halo_bytes_forward_exchange": [int(v) for v in c.received],
            "messages_forward_exchange": [int(v) for v in c.msgs_received],
            "memory_worst_rank": {k: float(v[worst]) for k, v in mem["by_layer"][c.index].items()},
            "memory_bytes_worst_rank": float(sum(v[worst] for v in mem["by_layer"][c.index].values())),
            "seconds": float(sum(t for _, t in mine)),
            "compute_s": float(sum(t for op, t in mine if op.kind == "compute")),
            "exchange_s": float(sum(t for op, t in mine if op.kind == "exchange")),
        })
    step_flops = sum(np.asarray(op.flops, float) for op in ops if op.kind == "compute") + np.zeros(len(counts[0].sent))
    step_halo = sum(np.asarray(op.received, float) for op in ops if op.kind == "exchange") + np.zeros(len(counts[0].sent))
    return {
        "machine": machine["name"], "stage": int(stage), "ranks": ranks, "replicas": replicas, "grid": list(dims),
        "batch": batch, "dtype": np.dtype(dtype).name, "ranks_per_node": rpn, "overlap": bool(overlap),
        "fuse": list(fuse), "fuse_filter": list(fuse_filter),
        "weight_halo": _weight_halo(counts, itemsize),
        "reduction": kind,
        "seconds": tot["compute"] + tot["exchange"] + tot["reduce"], "compute_s": tot["compute"],
        "exchange_s": tot["exchange"], "reduce_s": tot["reduce"],
        "node_egress_bytes": node_egress, "link_bound_s": link_bound, "nodes": int(nodes.max()) + 1 if len(nodes) else 1,
        "images_per_s": batch * replicas / max(tot["compute"] + tot["exchange"] + tot["reduce"], 1e-300),
        "flops_per_rank_max": float(step_flops.max()), "halo_bytes_per_rank_max": float(step_halo.max()),
        "memory_bytes": float(mem["total"][worst]), "memory_rank": worst,
        "memory": {k: float(np.asarray(v)[worst]) for k, v in mem.items() if k != "by_layer"},
        "device_memory_bytes": float(share["memory"]), "fits": bool(mem["total"][worst] <= share["memory"]),
        "layers": layers,
        "ops": [{"kind": op.kind, "what": op.what, "layer": op.layer, "label": op.label, "seconds": float(t)}
                for op, t in zip(ops, times)],
    }


def _weight_halo(counts: list, itemsize: int) -> dict[str, float]:
    """The frozen fused filters' weight halos of the largest rank: bytes kept, and bytes and messages of
    their one fetch (at a stage's first step, not every step)."""
    kept, recv, msgs = (sum(np.asarray(getattr(c, k), float) for c in counts if c.halo_params is not None)
                        for k in ("halo_params", "halo_received", "halo_msgs_received"))
    return {"bytes_kept": float(np.max(kept * itemsize + np.zeros(len(counts[0].sent)))),
            "bytes_fetched": float(np.max(recv + np.zeros(len(counts[0].sent)))),
            "messages_fetched": int(np.max(msgs + np.zeros(len(counts[0].sent))))}


def fit_error(network: Network, pred: dict[str, Any]) -> str | None:
    """Why a prediction does not fit in device memory (naming the layer that needs most), else None."""
    if pred["fits"]:
        return None
    big = max(pred["layers"], key=lambda l: l["memory_bytes_worst_rank"])
    return (f"does not fit: stage {pred['stage']} on grid {pred['grid'][0]}x{pred['grid'][1]} x {pred['replicas']} "
            f"replica(s) needs {gb(pred['memory_bytes'])} on rank {pred['memory_rank']}, the device has "
            f"{gb(pred['device_memory_bytes'])} ({pred['machine']}); the largest part is layer {big['index']} "
            f"({big['kind']} of stage {big['stage']}): {gb(big['memory_bytes_worst_rank'])} "
            f"(weights {gb(pred['memory']['weights'])}, gradients {gb(pred['memory']['gradients'])}, optimizer "
            f"{gb(pred['memory']['optimizer'])}, activations {gb(pred['memory']['activations'])} in all)")


def gb(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def candidates(ranks: int, replicas: int | None = None) -> list[tuple[int, tuple[int, int]]]:
    """(replicas, grid) splits of ``ranks``: every divisor (or the given replicas) x every grid."""
    reps = [replicas] if replicas else [r for r, _ in _divisor_pairs(ranks)]
    return [(r, pair) for r in reps if ranks % r == 0 for pair in _divisor_pairs(ranks // r)]


def suggest(network: Network, batch: int, ranks: int, machine: dict[str, Any], replicas: int | None = None,
            stages: Sequence[int] | None = None, **kw) -> list[dict[str, Any]]:
    """Every (replicas, grid) split of ``ranks``, best first: fitting plans by images per second
    (summed step time over ``stages``, all by default, per image), then the rest."""
    stages = list(range(len(network.stages))) if stages is None else list(stages)
    out = []
    for r, dims in candidates(ranks, replicas):
        preds = [predict_step(network, batch, ranks, dims, r, machine, stage=k, **kw) for k in stages]
        secs = sum(p["seconds"] for p in preds)
        out.append({"replicas": r, "grid": list(dims), "seconds": secs, "images_per_s": batch * r * len(stages) / secs,
                    "fits": all(p["fits"] for p in preds), "memory_bytes": max(p["memory_bytes"] for p in preds)})
    # ties: fewer replicas, then more rows (as choose_grid: row slabs are contiguous)
    out.sort(key=lambda c: (not c["fits"], -round(c["images_per_s"], 9), c["replicas"], -c["grid"][0]))
    return out


#: Rank counts tried when a plan does not fit: 2..4096, powers of two and three times them.
RANK_COUNTS = sorted({2**k for k in range(1, 13)} | {3 * 2**k for k in range(0, 11)})


def _cannot_fit(network: Network, batch: int, ranks: int, replicas: int, machine: dict[str, Any],
                stages: Sequence[int] | None, dtype: str = "float32", optimizer_slots: int = 2,
                ranks_per_node: int | None = None, tied: bool = True, **_: Any) -> bool:
    """True when no split of ``ranks`` can fit, by a bound that needs no halo counts: the weights,
    and a stage's gradient and optimizer state, spread evenly over a model group, already exceed
    a rank's memory (the largest rank holds at least the mean).  Saves :func:`smallest_fit` the
    exchange counts of every grid of the rank counts far below the fit (the paper's 11.2B
    network on 4 GB GPUs, which fits on 48: 2-24 skipped, ``cotsdl plan``'s refusal 14 s -> 11 s
    of CPU; 7 s once ``transfers`` also skipped the rank pairs that do not overlap)."""
    itemsize = np.dtype(dtype).itemsize
    one = counts_for(network, batch, (1, 1), itemsize)  # every weight on one rank: the model's memory formula
    rpn = int(ranks_per_node) if ranks_per_node else default_ranks_per_node(machine, ranks)
    memory_share = rank_share(machine, rpn)["memory"]
    for k in range(len(network.stages)) if stages is None else stages:
        mem = memory(network, one, k, itemsize, optimizer_slots, tied)
        held = float(mem["weights"][0] + mem["gradients"][0] + mem["optimizer"][0])  # split over the group
        if held / (ranks // replicas) > memory_share:
            return True
    return False


def smallest_fit(network: Network, batch: int, machine: dict[str, Any], replicas: int = 1,
                 stages: Sequence[int] | None = None, counts: Sequence[int] = RANK_COUNTS,
                 **kw) -> dict[str, Any] | None:
    """The best split of the fewest ranks (of ``counts``, ``replicas`` model groups) on which every
    stage fits in device memory, with its rank count under ``ranks``; None if none does."""
    for ranks in counts:
        if ranks % replicas or _cannot_fit(network, batch, ranks, replicas, machine, stages, **kw):
            continue
        best = suggest(network, batch, ranks, machine, replicas=replicas, stages=stages, **kw)
        if best and best[0]["fits"]:
            return {**best[0], "ranks": ranks}
    return None
