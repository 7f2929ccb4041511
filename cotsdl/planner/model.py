"""What one training step does on every rank: per-layer counts, the step's operations, memory.

Pure arithmetic on the network's layout (:func:`cotsdl.nn.layout.layout`, evaluated for
every rank of the grid) and the exchange messages (:func:`cotsdl.array.messages.transfers`);
the FLOP and byte counts of each pass are the layers' own (``layer.cost``, from
:mod:`cotsdl.ops.costs`).  No MPI, no arrays.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..array.messages import transfers
from ..array.partition import grid_coords
from ..nn.layout import fuse_rows, interior_pieces, layout, split_sites
from ..nn.network import Network
from ..ops.cuda.filter import by_sites, sites_rows

#: Weight-sized work arrays an optimizer's update keeps besides its slots (two: Adam's m_hat and v_hat,
#: AdaGrad's and RMSProp's numerator and denominator; momentum's one and, with ``clip_norm``, the clipped
#: gradient -- a third beside Adam's; see train/optim.py).
#: The slots themselves are a count the caller gives (``optimizer_slots``): the planner sits on a
#: floor below ``train`` and never reads the optimizer registry; ``train.optim.slot_count`` gives the
#: count of a config's ``train.optimizer``, ``len(optimizer.slots)`` of an optimizer.
UPDATE_WORK_ARRAYS = 2

#: Words per weight that an update reads and writes, by the optimizer's slots, counted in ``train.optim``
#: as numpy runs it (every in-place operation reads its operands and writes its result): plain SGD 5,
#: momentum 10, Adam 33 (AdaGrad, RMSProp and LARS, one slot, 17-22; LAMB, two, 41).
#: ``cotsdl bench calibrate`` times an Adam step counting its 33 words, so ``elementwise`` is the
#: bandwidth such operations reach.
UPDATE_WORDS = {0: 5, 1: 10, 2: 33}

#: Words per weight of the norm projection after an update (``train.filter_norm``, which every config
#: sets): ``nn.network.filter_norms`` squares the weights a few MB at a time (read, write) and sums the
#: squares (read); the weights are scaled (read, write).
NORM_WORDS = 5

#: Words per input element of reading the next minibatch (``io.reader``, in a thread beside the step,
#: on the rank's cores): its bytes gathered, converted to float (write), standardized in place (read,
#: write), checked (read) and transposed (read, write).
READ_WORDS = 6


@dataclass
class LayerCounts:
    """One layer on every rank of the grid (arrays are per rank, in Cartesian rank order)."""

    index: int
    stage: int
    kind: str
    layer: Any
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    params: int  # the whole layer's weights (0 without weights)
    params_rank: np.ndarray
    passes: dict[str, tuple[np.ndarray, np.ndarray]]  # pass -> (FLOPs, bytes) of the local computation
    src_elems: np.ndarray  # owned elements of the input
    window_elems: np.ndarray
    out_elems: np.ndarray
    sent: np.ndarray  # bytes of one (forward) exchange into the window; the adjoint swaps sent/received
    received: np.ndarray
    local: np.ndarray  # bytes of the rank's own block inside its window
    msgs_sent: np.ndarray
    msgs_received: np.ndarray
    #: the calls a forward makes beyond one, with overlap: its border strips (computed after its halos
    #: arrive) and its interior's pieces after the first (nn.layout.interior_pieces); 0: the layer is not
    #: split on that rank -- no halo, no interior, or an LCN -- and overlap changes nothing there
    strips: np.ndarray
    #: bytes the exchange copies from the rank's own block into its window: ``local``, or 0 where the
    #: window is the owned block (``LayerBoxes.window_is_owned``: NetworkPlan uses the input itself)
    copied: np.ndarray
    #: bytes of device scratch the layer's backward-data holds on a GPU: the site products of
    #: backward-data by sites (``ops.cuda.filter.sites_rows``); 0 by cells and for other layers
    scratch: np.ndarray
    #: per rank, {peer: (bytes sent to it, bytes received from it, messages sent, messages received)} of one
    #: forward exchange (peers other than the rank): which cross nodes depends on the ranks per node
    peers: list = field(default_factory=list)
    #: False for the LCN of a fused stage: its window is its pool's output, no exchange fills it (nor the
    #: pool's of a frozen stage whose filter is fused too: its window is the filter's grown output)
    exchanged: bool = True
    #: a frozen fused filter (``fuse_filter``): per rank the weights of its grown sites, the weight halo
    #: the plan keeps (elements), and the bytes and messages received when it is fetched (once per stage,
    #: not per step); zeros elsewhere
    halo_params: np.ndarray | None = None
    halo_received: np.ndarray | None = None
    halo_msgs_received: np.ndarray | None = None
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = f"{self.kind}{self.stage}"


def layer_counts(network: Network, batch: int, dims: Sequence[int], itemsize: int = 4,
                 fuse: Sequence[int] = (), fuse_filter: Sequence[int] = ()) -> list[LayerCounts]:
    """Every layer's counts on every rank of a ``dims`` grid for minibatches of ``batch`` images.

    FLOPs of a rank's pass are the whole layer's times the share of units it owns (FLOPs
    are linear in units); its bytes are the layer's cost evaluated on the rank's input
    window and owned output (what the local pass reads and writes).  ``fuse``: stages whose pool
    and LCN share one exchange (``NetworkPlan(fuse=...)``): their pool counts the grown boxes
    (its one exchange, the pooled border it computes as well), their LCN no exchange.  ``fuse_filter``
    (a subset): stages whose filter joins them, a frozen stage's forward (``NetworkPlan(fuse_filter=...)``):
    their filter counts the grown sites (its one exchange, the outputs it computes as well, the weight
    halo), their pool no exchange.
    """
    coords = list(grid_coords(tuple(int(d) for d in dims)))
    plain = [layout(network, dims, c, batch)[1] for c in coords]
    rows = [fuse_rows(r, fuse, network.roles, fuse_filter) for r in plain]
    unexchanged = {network.layer_index(k, "lcn") for k in fuse}  # their window is their pool's output
    unexchanged |= {network.layer_index(k, "pool") for k in fuse_filter}  # theirs the filter's grown output
    grown = {network.layer_index(k, "filter") for k in fuse_filter}
    G = len(coords)
    out = []
    for li, layer in enumerate(network.layers):
        first = rows[0][li]
        owned, windows = [r[li].src_owned for r in rows], [r[li].window for r in rows]
        units = math.prod(layer.sites(first.in_shape))
        whole = layer.cost(first.in_shape, itemsize)
        arr = lambda: np.zeros(G)  # noqa: E731
        sent, recv, local, ms, mr, strips, copied = arr(), arr(), arr(), arr(), arr(), arr(), arr()
        passes = {p: (arr(), arr()) for p in whole}
        prank, scratch = arr(), arr()
        wshape = layer.weight_shape(first.in_shape) if layer.kind == "filter" else None
        gpu_by_sites = wshape is not None and by_sites(*layer.stride, first.in_shape[2])
        peers: list[dict[int, tuple[int, int, int, int]]] = []
        for r in range(G):
            s, rc = ([], []) if li in unexchanged else transfers(r, owned, windows)  # (its pool's output)
            mine_peers: dict[int, list[int]] = {}
            for way, ts in ((0, s), (1, rc)):
                for t in ts:
                    if t.peer != r:
                        acc = mine_peers.setdefault(t.peer, [0, 0, 0, 0])
                        acc[way] += t.box.size * itemsize
                        acc[2 + way] += 1
            peers.append({q: tuple(v) for q, v in mine_peers.items()})
            sent[r] = sum(t.box.size for t in s if t.peer != r) * itemsize
            recv[r] = sum(t.box.size for t in rc if t.peer != r) * itemsize
            local[r] = sum(t.box.size for t in s if t.peer == r) * itemsize
            ms[r], mr[r] = sum(t.peer != r for t in s), sum(t.peer != r for t in rc)
            lb = rows[r][li]
            copied[r] = 0 if lb.window_is_owned or li in unexchanged else local[r]
            if layer.kind in ("filter", "pool") and mr[r]:  # as NetworkPlan splits a layer
                inner, rest = split_sites(layer, lb.in_shape, lb.sites, owned[r] & windows[r])
                # the calls beyond one: the border strips, and the interior's pieces after the first
                strips[r] = 0 if inner.is_empty else len(rest) + len(interior_pieces(inner)) - 1
            if wshape is not None:  # the rank's own sites' weights (a grown filter's are in its halo)
                prank[r] = plain[r][li].sites.size * math.prod(wshape[2:])
            if lb.out.is_empty:
                continue
            share = lb.sites.size / units  # (a fused pool's grown sites: the border it computes twice)
            mine = layer.cost(lb.window.shape, itemsize)
            for p, c in whole.items():
                passes[p][0][r], passes[p][1][r] = c.flops * share, mine[p].bytes
            if gpu_by_sites:
                (SH, SW), R, N = lb.sites.shape, math.prod(wshape[3:]), first.in_shape[3]
                scratch[r] = sites_rows(SH, SW, R, N, itemsize) * SW * R * N * itemsize
        out.append(LayerCounts(li, network.stage_of(li), layer.kind, layer, first.in_shape, first.out_shape,
                               math.prod(wshape) if wshape else 0, prank, passes,
                               np.array([b.size for b in owned], float), np.array([b.size for b in windows], float),
                               np.array([r[li].out.size for r in rows], float), sent, recv, local, ms, mr, strips,
                               copied, scratch, peers, li not in unexchanged,
                               *(_weight_halo([r[li].sites for r in plain], [r[li].sites for r in rows], wshape,
                                              itemsize) if li in grown else (arr(), arr(), arr()))))
    return out


def _weight_halo(own: list, sites: list, wshape: Sequence[int], itemsize: int) -> tuple[np.ndarray, ...]:
    """(elements kept, bytes received, messages received) per rank of a frozen fused filter's weight halo:
    the weights of its grown ``sites`` from the owners of ``own`` sites (2-D boxes per rank)."""
    per_site = math.prod(wshape[2:])
    kept = np.array([s.size * per_site for s in sites], float)
    recv, msgs = np.zeros(len(own)), np.zeros(len(own))
    for r in range(len(own)):
        got = [t for t in transfers(r, own, sites)[1] if t.peer != r]
        recv[r] = sum(t.box.size for t in got) * per_site * itemsize
        msgs[r] = len(got)
    return kept, recv, msgs


@dataclass
class Op:
    """One operation of a step: ``kind`` compute | exchange | reduce, per-rank amounts."""

    kind: str
    what: str  # efficiency key (compute), "forward"/"adjoint" (exchange), "allreduce"
    layer: int | None  # layer index (None: not tied to one layer)
    flops: np.ndarray | float = 0.0
    bytes: np.ndarray | float = 0.0  # compute: memory traffic; exchange: (sent, received, local) below
    sent: np.ndarray | float = 0.0
    received: np.ndarray | float = 0.0
    local: np.ndarray | float = 0.0
    msgs_sent: np.ndarray | float = 0.0
    msgs_received: np.ndarray | float = 0.0
    group: int = 1  # allreduce: ranks taking part
    label: str = ""
    #: compute: the indices (in the step's ops) of the exchanges whose messages travel while this runs,
    #: with overlap (a split forward after its own exchange; the objective's ``meanwhile`` work)
    hides: tuple[int, ...] = ()


def step_ops(network: Network, counts: list[LayerCounts], stage: int, batch: int, replicas: int, itemsize: int,
             optimizer_slots: int, tied: bool = True) -> list[Op]:
    """The operations of one training step of ``stage`` (GreedyTrainer._train_step, StageObjective).

    Written from the trainer's step; ``tests/planner/test_step_counts.py`` counts the
    passes, exchanges and reductions of a real step and checks that they are these."""
    f, p = network.layer_index(stage, "filter"), network.layer_index(stage, "pool")
    G = len(counts[0].sent)
    ops: list[Op] = []

    def ex(li: int, direction: str, label: str) -> int:
        c = counts[li]
        s, r = (c.sent, c.received) if direction == "forward" else (c.received, c.sent)
        ms, mr = (c.msgs_sent, c.msgs_received) if direction == "forward" else (c.msgs_received, c.msgs_sent)
        ops.append(Op("exchange", direction, li, sent=s, received=r, local=c.copied, msgs_sent=ms, msgs_received=mr,
                      label=label))
        return len(ops) - 1

    def comp(li: int, pas: str, label: str, *hides: int, pairs: int = 1) -> None:
        c = counts[li]
        fl, by = c.passes[pas]
        ops.append(Op("compute", f"{c.kind}_{pas}", li, flops=fl * pairs, bytes=by * pairs, label=label,
                      hides=hides))

    def elementwise(elems: np.ndarray, passes: float, label: str, li: int | None = None) -> None:
        # one FLOP per element per pass, each pass reading or writing every element once
        ops.append(Op("compute", "elementwise", li, flops=elems * passes, bytes=elems * passes * itemsize,
                      label=label))

    def reduce(group: int, nbytes: float, label: str) -> None:
        ops.append(Op("reduce", "allreduce", None, bytes=nbytes, group=group, label=label))

    # (0) the minibatch: every rank's read is checked in one collective verdict
    reduce(G * replicas, 8, "reading check")
    elementwise(counts[0].src_elems, READ_WORDS, "the next minibatch read and converted (beside the step)", 0)
    # (1) the frozen stages below: forward only
    for li in range(f):
        if not counts[li].exchanged:  # a fused stage's LCN: its pool's exchange filled its window
            comp(li, "forward", "stage input: forward (fused: no exchange)")
        else:
            comp(li, "forward", "stage input: forward", ex(li, "forward", "stage input: exchange"))
        if counts[li].kind == "lcn":
            reduce(G, batch * itemsize, "LCN per-image mean")
    # (2) the objective
    comp(f, "forward", "encoder h = F(x)", ex(f, "forward", "encoder: exchange x"))
    comp(f, "backward_data", "decoder x_hat = F^T(h)")
    decoder_sums = ex(f, "adjoint", "decoder: sum into owners")
    comp(p, "forward", "pool P(h)", ex(p, "forward", "pool: exchange h"), decoder_sums)  # while the sums travel
    reduce(G, 2 * 8, "loss terms")
    x_own, h_own = counts[f].src_elems, counts[f].out_elems
    elementwise(x_own, 3, "dx_hat = 2 (x_hat - x) / N and the loss sums (one pass: ops/residual.py)", f)
    comp(f, "forward", "decoder transpose F(dx_hat)", ex(f, "forward", "decoder transpose: exchange dx_hat"))
    elementwise(counts[p].out_elems, 1, "dP = lam / N", p)
    comp(p, "backward", "pool backward")
    sparsity_sums = ex(p, "adjoint", "pool backward: sum into owners")
    elementwise(h_own, 3, "dh += P^T(lam / N)", f)
    if tied:  # one pass over both pairs, (x, dh) and (dx_hat, h): one reduction twice as long
        comp(f, "backward_weights", "dW encoder + decoder (one pass)", pairs=2)
    else:
        comp(f, "backward_weights", "dW decoder", sparsity_sums)  # (it runs while those sums travel)
        comp(f, "backward_weights", "dW encoder")
    w = counts[f].params_rank
    copies = 1 if tied else 2
    # (3) data parallelism: this rank's gradient block averaged over the replicas
    if replicas > 1:
        reduce(replicas, w * itemsize * copies, "gradient over replicas")
        elementwise(w * copies, 2, "gradient / replicas", f)
        reduce(replicas, 3 * 8, "losses over replicas")
    # (4) finite checks and the update
    elementwise(w * copies, 1, "finite check of the gradient", f)
    reduce(G * replicas, 3 * 8, "finite check, and the signs of a dead stage (train/vitals.py)")
    elementwise(w * copies, UPDATE_WORDS[optimizer_slots], f"update ({optimizer_slots} optimizer slot(s))", f)
    elementwise(w * copies, NORM_WORDS, "filter norms and their projection", f)
    elementwise(w * copies, 1, "finite check of the weights", f)
    reduce(G * replicas, 2 * 8, "finite check and filter norms of the weights")
    # (5) the step's bookkeeping: the slowest rank's exchange time, and the agreed stop check
    reduce(G * replicas, 2 * 8, "exchange time and read wait (max)")
    reduce(G * replicas, 8, "stop check (signals)")
    return ops


#: A CPU rank's own bytes before its first array when the machine does not say (``process_bytes``,
#: written by ``cotsdl bench calibrate``): the interpreter, numpy, MPI, HDF5, scipy and the native
#: kernels, as a ``cotsdl train`` rank of the development VM held them (105 MiB), rounded up.
PROCESS_BYTES = 128 << 20

#: The categories of :func:`memory`: what a GPU rank holds on its device, then what a CPU rank also holds
#: in host memory (on a GPU machine those are host memory and count 0: the fit is the device's).
DEVICE_CATEGORIES = ("weights", "gradients", "optimizer", "activations", "buffers", "temporaries")
HOST_CATEGORIES = ("reader", "diagnostics", "runtime")


def runtime_bytes(machine: dict[str, Any]) -> float:
    """A rank's own bytes before its first array on ``machine``: its ``process_bytes`` (calibrated), else
    :data:`PROCESS_BYTES` on a CPU machine; 0 on a GPU machine (host memory, not the device's)."""
    if machine["kind"] == "gpu":
        return 0.0
    return float(machine.get("process_bytes") or PROCESS_BYTES)


def memory(network: Network, counts: list[LayerCounts], stage: int, itemsize: int, optimizer_slots: int,
           tied: bool = True, gpu: bool = False, runtime: float = 0.0) -> dict[str, Any]:
    """Bytes per rank (arrays over ranks) at the peak of training ``stage``, by category and by layer.

    What a device holds (:data:`DEVICE_CATEGORIES`; a CPU rank holds them in its memory):
    Weights: every filter layer's block (twice untied), and the weight halo of every frozen stage
    whose filter is fused (``fuse_filter``: its grown sites' encoder weights, kept while it is frozen).  Gradients: the stage's gradient block
    (tied: one, both pairs' gradients summed in one pass; untied: one each).  Optimizer: its
    slots for the stage and the two work arrays its update runs in (``train.optim``: kept from
    step to step; momentum's one and a clipped gradient).  Activations: what
    the step keeps alive at its peak -- windows, outputs (and LCN caches, about an output)
    of the frozen layers below, then the objective's arrays (3 windows of the filter input,
    3 blocks of the stage input, 4 filter outputs, 2 pool windows, 2 pool outputs).
    Buffers: packed send and receive buffers of every exchange of the step, and with ``gpu`` the
    site products the filter's backward-data holds where it goes by sites (``LayerCounts.scratch``).
    Temporaries: the largest memory held for a moment outside the step: on a GPU one weight block of
    the stage (the norm projection's squares, ``nn.network.filter_norms``), on a CPU rank the
    checkpoint's shard, which ``io.checkpoint.save`` builds in memory before writing it (every layer's
    weights and the stage's optimizer slots).

    What a CPU rank also holds (:data:`HOST_CATEGORIES`; 0 with ``gpu``): Reader: the minibatch read
    ahead (``io.reader``: prefetch) and the copy it is converted from.  Diagnostics: the stage's
    initial weights, kept to compare the filters with at every log line (``nn.stage_stats``).
    Runtime: the process itself before its first array (``runtime``: :func:`runtime_bytes`).
    Workspaces (scratch of a few MiB per layer) are not counted.
    """
    f, p = network.layer_index(stage, "filter"), network.layer_index(stage, "pool")
    copies = 1 if tied else 2
    G = len(counts[0].sent)
    cats = DEVICE_CATEGORIES + HOST_CATEGORIES[:-1]  # the runtime belongs to no layer
    by_layer = {c.index: {k: np.zeros(G) for k in cats} for c in counts}
    for c in counts:
        by_layer[c.index]["weights"] += c.params_rank * copies * itemsize
        if c.halo_params is not None and c.index < f:  # a frozen fused filter's weight halo (the encoder's)
            by_layer[c.index]["weights"] += c.halo_params * itemsize
    w = counts[f].params_rank
    by_layer[f]["gradients"] += w * copies * itemsize
    by_layer[f]["optimizer"] += w * (optimizer_slots + UPDATE_WORK_ARRAYS) * copies * itemsize
    for c in counts[:f]:
        by_layer[c.index]["activations"] += (c.window_elems + c.out_elems * (2 if c.kind == "lcn" else 1)) * itemsize
    cf, cp = counts[f], counts[p]
    by_layer[f]["activations"] += (3 * cf.window_elems + 3 * cf.src_elems + 4 * cf.out_elems) * itemsize
    by_layer[p]["activations"] += (2 * cp.window_elems + 2 * cp.out_elems) * itemsize
    for c in counts[:p + 1]:  # the adjoint's packed buffers are its own
        by_layer[c.index]["buffers"] += (c.sent + c.received) * (2 if c.index in (f, p) else 1)
    if gpu:  # the decoder's backward-data, at most one at a time
        by_layer[f]["buffers"] += cf.scratch
        by_layer[f]["temporaries"] += w * copies * itemsize
    else:
        shard = (sum(c.params_rank for c in counts) + w * optimizer_slots) * copies * itemsize
        by_layer[f]["temporaries"] += shard
        by_layer[0]["reader"] += 2 * counts[0].src_elems * itemsize
        by_layer[f]["diagnostics"] += w * itemsize
    out = {k: sum(d[k] for d in by_layer.values()) for k in cats}
    out["runtime"] = np.full(G, 0.0 if gpu else float(runtime))
    out["total"] = sum(out[k] for k in DEVICE_CATEGORIES + HOST_CATEGORIES)
    out["by_layer"] = by_layer
    return out
