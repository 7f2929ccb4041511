"""Machine descriptions for the run planner: the format, the presets, the loader, the op-time model.

A machine is plain JSON (``cotsdl bench calibrate`` writes one for the machine it runs on)::

    {"name": str, "kind": "cpu" | "gpu", "source": str,
     "device": {"peak_flops": FLOP/s of one device (gpu) or of the whole node (cpu),
                "memory_bandwidth": bytes/s (same scope as peak_flops),
                "memory_bytes": bytes per device (gpu) or per node (cpu),
                "cores": int (cores per node), "devices_per_node": int},
     "efficiency": {"filter_forward": f, "filter_backward_data": f, "filter_backward_weights": f,
                    "pool_forward": f, "pool_backward": f, "lcn_forward": f, "lcn_backward": f,
                    "elementwise": f},
     "overhead_s": seconds per operation call (kernel launch, Python),
     "link": {"alpha_s": seconds per message, "beta_s_per_byte": seconds per byte},
     "node_link": {"alpha_s": ..., "beta_s_per_byte": ..., (optional) "sustained_bytes_per_s": bytes/s,
                   "burst_bytes": bytes} (optional: the link between nodes, where it differs),
     "load": {"host": str, "other_busy_cores": cores, ...} (optional: what a calibration saw),
     "efficiency_by_size": [{"case": str, "bytes": {op: bytes}, "by_threads": {"1": {op: f}, ...}}, ...]
                   (optional: efficiencies measured on passes of those sizes),
     "efficiency_by_shape": [{"shape": str, "case": str, "bytes": {op: bytes}, "by_threads": {"1": {op: f}}},
                             ...] (optional: the same per layer shape, ``Network.pass_shape``; its ops only),
     "process_bytes": bytes (optional: a CPU rank's own memory before its first array)}

The time of one operation on one rank (:func:`op_seconds`) is the roofline divided by
the efficiency of that kind of operation, plus a fixed overhead::

    t = max(flops / rate, bytes / bandwidth) / efficiency + overhead_s

``rate`` and ``bandwidth`` are the rank's share (:func:`rank_share`): a GPU rank has
its device (or a fraction of it when more ranks than devices share a node); a CPU rank
has ``cores / ranks_per_node`` of the node's cores, hence that fraction of its peak
and of its memory bandwidth.  An efficiency is thus the fraction of the roofline an
operation reaches, which is what a calibration measures (roofline time / measured time).
Where the machine has ``efficiency_by_size`` the efficiency is that of the op's own bytes
(:func:`efficiency`): a pass whose arrays stay in cache and one that streams hundreds of
MB from memory reach different fractions of the roofline.  Where it also has
``efficiency_by_shape`` entries of the op's layer shape (:meth:`cotsdl.nn.network.Network.pass_shape`:
the per-site product's sizes, the batch included), those are taken instead: the speed of a pass
depends on its shape as much as on its bytes (the demo's backward-weights pass reduces over 32
images at 0.38 of the roofline and over 96 at 0.73, at bytes in between).

``link`` is the link between ranks of one node and, without ``node_link``, between nodes
too; ``node_link`` is the link between nodes, measured apart by a calibration that spans
nodes.  A message to a rank on another node costs ``alpha + bytes * beta`` of ``node_link``
(:func:`message_seconds` with ``across=True``).  A link that holds a lower rate over time
than a single message sees (a token bucket: a shaped or policed link, ``tc tbf``) also has
``sustained_bytes_per_s`` and ``burst_bytes``: a node cannot send more per step than the
sustained rate allows (:func:`cotsdl.planner.predict.predict_step` bounds the step by it).

A calibration measures under the load of its moment, and its numbers hold under that load:
``load`` records the cores other processes kept busy meanwhile (:mod:`cotsdl.planner.load`),
and :func:`load_warning` says when the load now differs from it.
"""
from __future__ import annotations

import json
import math
import socket
import time
from pathlib import Path
from typing import Any

EFFICIENCY_KEYS = ("filter_forward", "filter_backward_data", "filter_backward_weights", "pool_forward",
                   "pool_backward", "lcn_forward", "lcn_backward", "elementwise")
DEVICE_KEYS = ("peak_flops", "memory_bandwidth", "memory_bytes", "cores", "devices_per_node")
TOP_KEYS = ("name", "kind", "source", "device", "efficiency", "overhead_s", "link")
LINK_KEYS = ("alpha_s", "beta_s_per_byte")
NODE_LINK_KEYS = LINK_KEYS + ("sustained_bytes_per_s", "burst_bytes")  # the last two optional
LOAD_KEYS = ("host", "other_busy_cores", "cores_watched", "seconds", "loadavg1")
#: Other busy cores now and at calibration differing by this much or more: the predictions may be off
#: (one core kept busy on this 2-core machine made a quiet calibration predict 0.44x the 2-rank demo step).
LOAD_MARGIN = 0.5
#: Seconds the load now is measured over (cotsdl plan waits that long once).
LOAD_WINDOW = 0.5

# GPU efficiencies: MEASURED on one H100 80GB HBM3 for the paper-sized layer (`cotsdl bench layers
# --backend cuda`, 2026-11-27, cuda/README.md): the filter passes at 0.21 / 0.20 / 0.24 of the fp32
# peak, pooling at 0.18 / 0.19 and LCN at 0.034 / 0.021 of the memory bandwidth (forward / backward;
# LCN is tens of CuPy operations); elementwise passes are assumed at 0.6.  The per-call overhead is
# what a pooling pass on a small shape took there (37-46 us: launch and Python).  The other GPUs
# are ASSUMED to reach the same fractions of their own peaks: nothing has been timed on them.
_GPU_EFF = {"filter_forward": 0.21, "filter_backward_data": 0.20, "filter_backward_weights": 0.24,
            "pool_forward": 0.18, "pool_backward": 0.19, "lcn_forward": 0.034, "lcn_backward": 0.021,
            "elementwise": 0.6}
_GPU_OVERHEAD_S = 40e-6
_H100_NOTE = "efficiencies MEASURED on one H100 (cotsdl bench layers --backend cuda, paper layer; elementwise assumed)"
# H200: MEASURED on one H200 (`cotsdl bench layers --backend cuda --shapes paper,P-185m`, 2026-11-28, with
# the cp.async GEMM defaults, cuda/README.md): the paper layer's filter passes at 0.40 / 0.26 / 0.27 of
# the fp32 peak, pooling at 0.14 / 0.12 and LCN at 0.025 / 0.015 of the bandwidth; and by layer shape
# the filter passes of the 185M network's first layer at 0.11 / 0.068 / 0.15 (4x4 blocks of K = 1: its
# forward and backward-weights are 16-row products).  Elementwise passes and the per-call overhead as for
# the H100.
_H200_EFF = {**_GPU_EFF, "filter_forward": 0.396, "filter_backward_data": 0.256, "filter_backward_weights": 0.274,
             "pool_forward": 0.136, "pool_backward": 0.125, "lcn_forward": 0.025, "lcn_backward": 0.015}
_H200_BY_SHAPE = [
    {"shape": shape, "case": case, "bytes": {op: nbytes for op in ("filter_forward", "filter_backward_data",
                                                                   "filter_backward_weights")},
     "by_threads": {"1": {"filter_forward": f, "filter_backward_data": d, "filter_backward_weights": w}}}
    for shape, case, nbytes, (f, d, w) in (
        ("filter 18x18 stride 2x2 block 4x4 K=8 C=3 N=96", "paper", 4674330624, (0.396, 0.256, 0.274)),
        ("filter 18x18 stride 2x2 block 4x4 K=1 C=3 N=96", "P-185m", 624611328, (0.108, 0.068, 0.153)))]
_H200_NOTE = ("efficiencies MEASURED on one H200 (cotsdl bench layers --backend cuda: the paper layer, and by "
              "shape the 185M network's first layer; elementwise assumed)")
_GPU_NOTE = "efficiencies ASSUMED: the fractions of peak measured on an H100 (nothing timed on this GPU)"


def _gpu(name: str, source: str, flops: float, bw: float, mem: float, per_node: int, cores: int,
         alpha: float, link_bytes_per_s: float, overhead: float = _GPU_OVERHEAD_S,
         note: str = _GPU_NOTE) -> dict[str, Any]:
    return {"name": name, "kind": "gpu", "source": f"{source}; {note}",
            "device": {"peak_flops": flops, "memory_bandwidth": bw, "memory_bytes": mem, "cores": cores,
                       "devices_per_node": per_node},
            "efficiency": dict(_GPU_EFF), "overhead_s": overhead,
            "link": {"alpha_s": alpha, "beta_s_per_byte": 1.0 / link_bytes_per_s}}


PRESETS: dict[str, dict[str, Any]] = {
    # The paper's cluster (Coates et al. 2013, seed 000): 4 GTX 680 per server, FDR InfiniBand
    # (56 Gb/s), MVAPICH2.  GTX 680 (NVIDIA spec): 1536 cores x 1006 MHz x 2 = 3.09 TFLOP/s fp32,
    # 192.2 GB/s; the paper's cards had 4 GB.  FDR 4x: 54.5 Gb/s of data = 6.8 GB/s; 10 us per
    # message assumed for MPI through host memory (2013 GPUs: no GPUDirect RDMA on GeForce).
    "gtx680-fdr": _gpu("gtx680-fdr", "GTX 680 spec sheet (3.09 TFLOP/s, 192 GB/s, 4 GB as in the paper), "
                       "FDR InfiniBand 56 Gb/s, 4 GPUs per node (paper)", 3.09e12, 192.2e9, 4 * 2**30, 4, 16,
                       10e-6, 6.8e9),
    # V100 SXM2 32 GB (NVIDIA datasheet): 15.7 TFLOP/s fp32, 900 GB/s.  NDR InfiniBand 400 Gb/s
    # = 50 GB/s per GPU (one adapter per GPU as in DGX systems); 3 us per message assumed.
    "v100-ndr": _gpu("v100-ndr", "V100 SXM2 datasheet (15.7 TFLOP/s fp32, 900 GB/s, 32 GB), NDR 400 Gb/s, "
                     "8 GPUs per node", 15.7e12, 900e9, 32 * 2**30, 8, 40, 3e-6, 50e9),
    # A100 SXM4 80 GB (NVIDIA datasheet): 19.5 TFLOP/s fp32 (non-tensor), 2039 GB/s.
    "a100-ndr": _gpu("a100-ndr", "A100 SXM4 80GB datasheet (19.5 TFLOP/s fp32, 2039 GB/s, 80 GB), NDR 400 Gb/s, "
                     "8 GPUs per node", 19.5e12, 2039e9, 80 * 2**30, 8, 64, 3e-6, 50e9),
    # H100 SXM5 80 GB (NVIDIA datasheet): 67 TFLOP/s fp32 (non-tensor), 3.35 TB/s.
    "h100-ndr": _gpu("h100-ndr", "H100 SXM5 80GB datasheet (67 TFLOP/s fp32, 3.35 TB/s, 80 GB), NDR 400 Gb/s, "
                     "8 GPUs per node", 67e12, 3.35e12, 80 * 2**30, 8, 112, 3e-6, 50e9, note=_H100_NOTE),
    # H200 SXM 141 GB (NVIDIA datasheet): 67 TFLOP/s fp32 (non-tensor, the H100's chip), 4.8 TB/s HBM3e.
    "h200-ndr": {**_gpu("h200-ndr", "H200 SXM datasheet (67 TFLOP/s fp32, 4.8 TB/s, 141 GB), NDR 400 Gb/s, "
                        "8 GPUs per node", 67e12, 4.8e12, 141e9, 8, 112, 3e-6, 50e9, note=_H200_NOTE),
                 "efficiency": dict(_H200_EFF), "efficiency_by_shape": _H200_BY_SHAPE},
}
#: ``this``: the calibration file of this machine (``cotsdl bench calibrate --json machine.json``).
THIS_FILE = "machine.json"


class MachineError(ValueError):
    """A machine description that cannot be used; names the file (or preset) and the key."""


def _check_by_threads(source: str, where: str, table: dict, upto: float | None = None,
                      keys: tuple[str, ...] = EFFICIENCY_KEYS) -> None:
    """``table``: thread counts ("1", "2", ...) -> an efficiency object with every one of ``keys``, each
    positive (at most ``upto``)."""
    for t, effs in table.items():
        if not (isinstance(t, str) and t.isdigit() and int(t) >= 1 and isinstance(effs, dict)):
            raise MachineError(f"machine {source}: {where}.{t}: keys must be thread counts "
                               "(\"1\", \"2\", ...) holding efficiency objects")
        for k in keys:
            if k not in effs:
                raise MachineError(f"machine {source}: missing key {where}.{t}.{k}")
            _positive(source, f"{where}.{t}.{k}", effs[k], upto=upto)


def _positive(src: str, path: str, v: Any, integer: bool = False, upto: float | None = None) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
    if ok and integer:
        ok = isinstance(v, int) or float(v).is_integer()
    if ok and upto is not None:
        ok = v <= upto
    if not ok:
        what = "a positive integer" if integer else ("a number in (0, 1]" if upto == 1 else "a positive number")
        raise MachineError(f"machine {src}: {path} = {v!r}: must be {what}")


def validate_machine(data: Any, source: str = "description") -> dict[str, Any]:
    """A checked copy of a machine description, or :class:`MachineError` naming ``source`` and the key."""
    if not isinstance(data, dict):
        raise MachineError(f"machine {source}: must be a JSON object with keys {', '.join(TOP_KEYS)}")
    for group, keys, where in ((data, TOP_KEYS, ""), (data.get("device"), DEVICE_KEYS, "device."),
                               (data.get("efficiency"), EFFICIENCY_KEYS, "efficiency."),
                               (data.get("link"), LINK_KEYS, "link.")):
        if not isinstance(group, dict):
            raise MachineError(f"machine {source}: {where.rstrip('.')} must be an object with keys {', '.join(keys)}")
        for k in keys:
            if k not in group:
                raise MachineError(f"machine {source}: missing key {where}{k}")
        extra = sorted(set(group) - set(keys))
        if extra and where:  # unknown keys at the top level are allowed (calibration notes, raw data)
            raise MachineError(f"machine {source}: unknown key {where}{extra[0]} (allowed: {', '.join(keys)})")
    if data["kind"] not in ("cpu", "gpu"):
        raise MachineError(f"machine {source}: kind = {data['kind']!r}: must be \"cpu\" or \"gpu\"")
    for k in ("name", "source"):
        if not isinstance(data[k], str) or not data[k]:
            raise MachineError(f"machine {source}: {k} = {data[k]!r}: must be a non-empty string")
    dev = data["device"]
    for k in ("peak_flops", "memory_bandwidth", "memory_bytes"):
        _positive(source, f"device.{k}", dev[k])
    for k in ("cores", "devices_per_node"):
        _positive(source, f"device.{k}", dev[k], integer=True)
    for k in EFFICIENCY_KEYS:
        _positive(source, f"efficiency.{k}", data["efficiency"][k], upto=1)
    ov = data["overhead_s"]
    if not (isinstance(ov, (int, float)) and not isinstance(ov, bool) and math.isfinite(ov) and ov >= 0):
        raise MachineError(f"machine {source}: overhead_s = {ov!r}: must be a number >= 0")
    _positive(source, "link.alpha_s", data["link"]["alpha_s"])
    _positive(source, "link.beta_s_per_byte", data["link"]["beta_s_per_byte"])
    if "node_link" in data:
        node = data["node_link"]
        if not isinstance(node, dict):
            raise MachineError(f"machine {source}: node_link must be an object with keys {', '.join(NODE_LINK_KEYS)}")
        extra = sorted(set(node) - set(NODE_LINK_KEYS))
        if extra:
            raise MachineError(f"machine {source}: unknown key node_link.{extra[0]} (allowed: {', '.join(NODE_LINK_KEYS)})")
        for k in LINK_KEYS:
            if k not in node:
                raise MachineError(f"machine {source}: missing key node_link.{k}")
            _positive(source, f"node_link.{k}", node[k])
        if "sustained_bytes_per_s" in node:
            _positive(source, "node_link.sustained_bytes_per_s", node["sustained_bytes_per_s"])
        b = node.get("burst_bytes", 0)
        if not (isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) and b >= 0):
            raise MachineError(f"machine {source}: node_link.burst_bytes = {b!r}: must be a number >= 0")
    # Optional refinements (written by `cotsdl bench calibrate`): efficiencies of a rank running
    # t threads, and each op's fixed cost per call.
    _check_by_threads(source, "efficiency_by_threads", data.get("efficiency_by_threads") or {}, upto=1)
    _check_by_size(source, data.get("efficiency_by_size"))
    _check_by_shape(source, data.get("efficiency_by_shape"))
    if "process_bytes" in data:
        _positive(source, "process_bytes", data["process_bytes"])
    for k, v in (data.get("overhead_by_op_s") or {}).items():
        if k not in EFFICIENCY_KEYS:
            raise MachineError(f"machine {source}: unknown key overhead_by_op_s.{k} (allowed: {', '.join(EFFICIENCY_KEYS)})")
        _positive(source, f"overhead_by_op_s.{k}", v)
    if "load" in data:
        _check_load(source, data["load"])
    out = json.loads(json.dumps(data))  # a deep copy: presets stay untouched
    out["device"]["cores"] = int(dev["cores"])
    out["device"]["devices_per_node"] = int(dev["devices_per_node"])
    return out


#: The ops of each layer kind (the keys of an ``efficiency_by_shape`` entry)
OPS_OF_KIND = {"filter": EFFICIENCY_KEYS[:3], "pool": EFFICIENCY_KEYS[3:5], "lcn": EFFICIENCY_KEYS[5:7]}


def _check_by_size(source: str, cases: Any) -> None:
    """``efficiency_by_size``: absent, or a list of {case, bytes: {op: > 0}, by_threads: {"t": {op: > 0}}}: not
    capped at 1, as a pass whose data stay in cache, or a thread that runs faster than its share of the
    all-core peak, beats the roofline of its minimum bytes or share."""
    _check_entries(source, "efficiency_by_size", cases, "cases", lambda where, c: EFFICIENCY_KEYS)


def _check_by_shape(source: str, entries: Any) -> None:
    """``efficiency_by_shape``: absent, or a list of {shape: "KIND ...", case, bytes: {op: > 0}, by_threads:
    {"t": {op: > 0}}} with the ops of the shape's layer kind (:data:`OPS_OF_KIND`), not capped at 1."""
    def ops_of(where: str, e: dict) -> tuple[str, ...]:
        kind = e["shape"].split(" ", 1)[0] if isinstance(e.get("shape"), str) else None
        if kind not in OPS_OF_KIND:
            raise MachineError(f"machine {source}: {where}.shape = {e.get('shape')!r}: must be a string starting "
                               f"with one of {', '.join(OPS_OF_KIND)}")
        return OPS_OF_KIND[kind]

    _check_entries(source, "efficiency_by_shape", entries, "layer shapes", ops_of)


def _check_entries(source: str, key: str, entries: Any, what: str, ops_of) -> None:
    """A list of {..., bytes: {op: > 0}, by_threads: {"t": {op: > 0}}} under ``key``, absent allowed, with the
    ops ``ops_of(where, entry)`` names."""
    if entries is None:
        return
    if not isinstance(entries, list):
        raise MachineError(f"machine {source}: {key} must be a list of {what}")
    for i, e in enumerate(entries):
        where = f"{key}[{i}]"
        if not (isinstance(e, dict) and isinstance(e.get("bytes"), dict) and isinstance(e.get("by_threads"), dict)
                and e["by_threads"]):
            raise MachineError(f"machine {source}: {where} must be an object with keys "
                               + ("shape, " if key == "efficiency_by_shape" else "") + "case, bytes, by_threads")
        ops = ops_of(where, e)
        for k in ops:
            if k not in e["bytes"]:
                raise MachineError(f"machine {source}: missing key {where}.bytes.{k}")
            _positive(source, f"{where}.bytes.{k}", e["bytes"][k])
        _check_by_threads(source, f"{where}.by_threads", e["by_threads"], keys=ops)  # above 1: a pass beat its roofline


def _check_load(source: str, load: Any) -> None:
    """``load``: an object of :data:`LOAD_KEYS` (any may be missing), numbers >= 0 or null, ``host`` a string."""
    if not isinstance(load, dict):
        raise MachineError(f"machine {source}: load must be an object with keys {', '.join(LOAD_KEYS)}")
    extra = sorted(set(load) - set(LOAD_KEYS))
    if extra:
        raise MachineError(f"machine {source}: unknown key load.{extra[0]} (allowed: {', '.join(LOAD_KEYS)})")
    for k, v in load.items():
        ok = isinstance(v, str) if k == "host" else (
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0)
        if v is not None and not ok:
            raise MachineError(f"machine {source}: load.{k} = {v!r}: must be "
                               + ("a string" if k == "host" else "a number >= 0") + " or null")


def load_machine(name_or_path: str | Path | dict) -> dict[str, Any]:
    """A validated machine: a preset name (``gtx680-fdr``, ``v100-ndr``, ``a100-ndr``, ``h100-ndr``),
    ``this`` (``./machine.json``), a JSON file path, or a description dict."""
    if isinstance(name_or_path, dict):
        return validate_machine(name_or_path)
    name = str(name_or_path)
    if name in PRESETS:
        return validate_machine(PRESETS[name], f"preset {name}")
    path = Path(THIS_FILE if name == "this" else name)
    if not path.is_file():
        what = (f"'this' means {THIS_FILE} in the current folder (write it with "
                f"`mpiexec -n 2 cotsdl bench calibrate --json {THIS_FILE}`), and there is none") if name == "this" \
            else f"no preset or file named {name!r}"
        raise MachineError(f"machine {name}: {what}; presets: {', '.join(PRESETS)}, this, or a JSON file")
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise MachineError(f"machine {path}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MachineError(f"machine {path}: not valid JSON: {e}") from None
    return validate_machine(data, str(path))


def default_machine() -> dict[str, Any] | None:
    """The machine a command uses when not told: this machine's calibration (``./machine.json``),
    else None (``cotsdl plan`` then takes the ``gtx680-fdr`` preset; ``parallel.overlap = "auto"``
    its rule without a model)."""
    return load_machine("this") if Path(THIS_FILE).is_file() else None


def default_ranks_per_node(machine: dict[str, Any], ranks: int) -> int:
    """Ranks on one node when not told: one per GPU, or one per core on a CPU node (at most ``ranks``)."""
    dev = machine["device"]
    return max(1, min(int(ranks), dev["devices_per_node"] if machine["kind"] == "gpu" else dev["cores"]))


def rank_share(machine: dict[str, Any], ranks_per_node: int) -> dict[str, float]:
    """The FLOP rate, memory bandwidth and memory (bytes) of one rank, its threads, and ``slice``: the
    factor by which time-sharing a core stretches its fixed costs (1 unless CPU ranks outnumber cores)."""
    dev = machine["device"]
    rpn = max(1, int(ranks_per_node))
    if machine["kind"] == "gpu":
        # ranks beyond the node's devices share one (time-sliced); fewer ranks use one device each
        f = min(1.0, dev["devices_per_node"] / rpn)
    else:
        # a rank's core share; ranks beyond the cores share them, and as halo exchanges keep the ranks
        # in step (a rank waiting in MPI polls its core), the most crowded core sets the pace:
        # ceil(rpn / cores) ranks on one core, each with that fraction of it
        f = 1.0 / rpn if rpn <= dev["cores"] else 1.0 / (dev["cores"] * math.ceil(rpn / dev["cores"]))
    # device memory: a GPU's own (shared when ranks share it), a CPU node's split over its ranks
    mem = dev["memory_bytes"] * (f if machine["kind"] == "gpu" else 1.0 / rpn)
    threads = max(1, dev["cores"] // rpn) if machine["kind"] == "cpu" else 1  # as cotsdl train sets them
    # ... and its fixed costs per call (Python, launches) take that many times their calibrated wall
    # time too, as its FLOPs do through f
    slice_ = float(math.ceil(rpn / dev["cores"])) if machine["kind"] == "cpu" and rpn > dev["cores"] else 1.0
    return {"flops": dev["peak_flops"] * f, "bandwidth": dev["memory_bandwidth"] * f, "memory": mem,
            "threads": threads, "slice": slice_}


def _for_threads(by: dict[str, dict[str, float]], threads: int) -> dict[str, float] | None:
    """The efficiencies of the nearest thread count at or below ``threads`` (None: none)."""
    counts = sorted(int(t) for t in by if int(t) <= threads)
    return by[str(counts[-1])] if counts else None


def efficiency(machine: dict[str, Any], share: dict[str, float], op: str, nbytes: float | None = None,
               shape: str | None = None) -> float:
    """The efficiency of ``op`` for a rank running ``share["threads"]`` threads: the calibrated value
    for that thread count when the machine has one (the nearest count below), else ``efficiency``.

    With ``nbytes`` (the op's bytes) and a machine with ``efficiency_by_size``: the cases' efficiencies
    interpolated at ``nbytes``, linearly in log(bytes) between the two cases around it (the nearest one
    outside their range): a pass of the paper's layer streams its 264 MB of weights from memory, the
    demo's stay in cache.  With ``shape`` (:meth:`~cotsdl.nn.network.Network.pass_shape` of the op's
    layer) and ``efficiency_by_shape`` entries of that shape holding ``op``: the same over those entries
    only."""
    threads = share.get("threads", 1)
    if nbytes and nbytes > 0:
        for cases in ([e for e in machine.get("efficiency_by_shape") or [] if e["shape"] == shape and op in e["bytes"]]
                      if shape else [], machine.get("efficiency_by_size") or []):
            points = [(math.log(c["bytes"][op]), effs[op]) for c in cases
                      if (effs := _for_threads(c["by_threads"], threads)) is not None]
            if points:
                return _at(sorted(points), math.log(nbytes))
    effs = _for_threads(machine.get("efficiency_by_threads") or {}, threads)
    return effs[op] if effs is not None else machine["efficiency"][op]


def _at(points: list[tuple[float, float]], x: float) -> float:
    """The sorted ``points`` (x, y) interpolated linearly at ``x`` (the nearest one outside their range)."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, e0), (x1, e1) in zip(points, points[1:]):
        if x <= x1:
            return e0 + (e1 - e0) * (x - x0) / (x1 - x0) if x1 > x0 else e1
    return points[-1][1]


def op_seconds(machine: dict[str, Any], share: dict[str, float], op: str, flops: float, nbytes: float,
               calls: int = 1, shape: str | None = None) -> float:
    """``max(flops / rate, bytes / bandwidth) / efficiency[op] + calls * overhead_s * slice`` (0 for no
    work; ``shape``: the layer's pass shape, :func:`efficiency`)."""
    if flops <= 0 and nbytes <= 0:
        return 0.0
    roof = max(flops / share["flops"], nbytes / share["bandwidth"])
    return roof / efficiency(machine, share, op, nbytes, shape) + calls * call_seconds(machine, op, share)


def call_seconds(machine: dict[str, Any], op: str | None = None, share: dict[str, float] | None = None) -> float:
    """The fixed cost of one call of ``op``: its calibrated ``overhead_by_op_s``, else (and for ``op``
    None, e.g. an exchange) ``overhead_s``; for a rank of ``share``, times its ``slice``."""
    return (machine.get("overhead_by_op_s") or {}).get(op, machine["overhead_s"]) * (share or {}).get("slice", 1.0)


def link_of(machine: dict[str, Any], across: bool = False) -> dict[str, float]:
    """The link within a node, or (``across``) between nodes: ``node_link`` where the machine has one."""
    return (machine.get("node_link") or machine["link"]) if across else machine["link"]


def message_seconds(machine: dict[str, Any], messages: float, nbytes: float, across: bool = False) -> float:
    """``messages * alpha + bytes * beta`` on the link within a node, or between nodes (``across``)."""
    link = link_of(machine, across)
    return messages * link["alpha_s"] + nbytes * link["beta_s_per_byte"]


def sustained_rate(machine: dict[str, Any]) -> float | None:
    """Bytes/s a node can send to other nodes over time (a token bucket's rate), where known."""
    return (machine.get("node_link") or {}).get("sustained_bytes_per_s")


_NOW: dict[tuple, tuple[float, float | None]] = {}  # (pids, cpus) -> (when measured, other busy cores)


def load_now(pids=None, cpus=None) -> float | None:
    """Other busy cores now (:func:`cotsdl.planner.load.measure` over :data:`LOAD_WINDOW`; ``pids``: the
    job's processes, default this one), measured once a minute at most: several machines share it."""
    from . import load  # noqa: PLC0415

    key = (tuple(sorted(pids)) if pids else None, tuple(sorted(cpus)) if cpus else None)
    when, value = _NOW.get(key, (-math.inf, None))
    if time.monotonic() - when > 60:
        value = load.measure(LOAD_WINDOW, pids, cpus)
        _NOW[key] = (time.monotonic(), value)
    return value


def load_warning(machine: dict[str, Any], now: float | None = None, pids=None, cpus=None,
                 ranks_per_node: int | None = None) -> str | None:
    """One line when ``machine`` was calibrated on this host under a load (other busy cores) that differs
    from the load ``now`` by :data:`LOAD_MARGIN` or more, or (given ``ranks_per_node``, a CPU machine)
    when those ranks and the other busy cores together outnumber its cores by that much: the model
    times ranks sharing cores with each other, not with other processes (4 ranks on 2 cores beside one
    busy core measured 2x the prediction here); else None.

    None without a recorded load (presets, older calibration files), for a calibration of another host
    (its load now is not measurable here) and where the load cannot be read.  ``now`` None: measured
    (:func:`load_now`, ``pids`` and ``cpus`` as there), only when there is something to compare.
    """
    rec = machine.get("load") or {}
    then = rec.get("other_busy_cores")
    if then is None or rec.get("host") not in (None, socket.gethostname()):
        return None
    now = load_now(pids, cpus) if now is None else now
    if now is None:
        return None
    if abs(now - then) >= LOAD_MARGIN:
        return (f"warning: machine {machine['name']} was calibrated with {then:.1f} other busy cores, now {now:.1f}: "
                "predictions may be off; recalibrate under the load you will run with (cotsdl bench calibrate)")
    cores = machine["device"]["cores"]
    if (machine["kind"] == "cpu" and ranks_per_node and now >= LOAD_MARGIN
            and ranks_per_node + now >= cores + LOAD_MARGIN):
        return (f"warning: {ranks_per_node} rank(s) share the {cores} cores of machine {machine['name']} with other "
                f"processes that keep {now:.1f} of them busy: the model times ranks sharing cores with each other, "
                "not with other processes; predictions may be off")
    return None
