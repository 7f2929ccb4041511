"""``cotsdl plan CONFIG``: the run planner (per-rank memory, FLOPs, halo traffic, predicted step time).

No MPI, no GPU: the layout of every rank is index arithmetic.  One config: a table per
layer and per stage for P ranks on a grid, the memory check (exit 2 when a plan does not
fit), and the best (replicas, grid) split of P ranks.  ``--table``: the predicted
scaling table of several configs x rank counts x machines (the paper's study on paper).
"""
from __future__ import annotations

import argparse
import json
from typing import Any


PAPER = ("The paper (Coates et al. 2013; seed 000): 4 GTX 680 per machine, FDR InfiniBand (56 Gb/s), MVAPICH2; "
         "block-local kernels exceed 1 TFLOP/s per GPU; 1B parameters on 3 machines (12 GPUs) in a couple of "
         "days; 11.2B parameters on 16 machines (64 GPUs).")


def add_parser(sub) -> None:
    sp = sub.add_parser("plan", help="per-rank memory, FLOPs, halo bytes and predicted step time of a config",
                        description="Plan a training run without running it: per layer the output shape, parameters "
                                    "(total and per rank), FLOPs per step, memory per rank (weights, optimizer, "
                                    "activations), halo bytes and messages, and the predicted step time on a machine; "
                                    "the best (replicas, grid) split of the ranks. Exit 2 when the plan does not fit "
                                    "in device memory. With --table: the predicted scaling table of several configs, "
                                    "e.g. cotsdl plan --table jobs/configs/paper-*.toml --ranks 4 9 16 36 64 "
                                    "--machine gtx680-fdr h100-ndr")
    sp.add_argument("config", nargs="+", help="training config(s) (TOML); several only with --table")
    sp.add_argument("--ranks", type=int, nargs="+", metavar="P", help="ranks in all (default: the grid's x replicas, or 1)")
    sp.add_argument("--grid", type=int, nargs=2, metavar=("PY", "PX"), help="model grid (default: the config's, or "
                                                                            "chosen as training would)")
    sp.add_argument("--replicas", type=int, help="data-parallel replicas (default: the config's)")
    sp.add_argument("--machine", nargs="+", metavar="FILE|PRESET", help="machine description(s): gtx680-fdr, v100-ndr, "
                    "a100-ndr, h100-ndr, h200-ndr, this (./machine.json from `cotsdl bench calibrate`) or a JSON file "
                    "(default: this if ./machine.json exists, else gtx680-fdr)")
    sp.add_argument("--stage", type=int, help="only this stage (default: every stage)")
    sp.add_argument("--ranks-per-node", type=int, help="ranks per node (default: one per GPU, or per core)")
    sp.add_argument("--fuse", choices=["on", "off", "auto"],
                    help="one halo exchange for each stage's pool and LCN (default: the config's parallel.fuse)")
    sp.add_argument("--fuse-filter", choices=["on", "off", "auto"],
                    help="a frozen fused stage's filter on the same exchange: one exchange of the stage's input, the "
                         "neighbours' weights fetched once (default: the config's parallel.fuse_filter)")
    sp.add_argument("--overlap", choices=["on", "off", "auto"],
                    help="halo/compute overlap; auto: on where the model predicts a gain on the machine "
                         "(default: the config's parallel.overlap, auto unless set)")
    sp.add_argument("--table", action="store_true", help="the scaling table of every config x --ranks x --machine")
    sp.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE", help="override a config key")
    sp.add_argument("--json", metavar="FILE", help="write everything as JSON")


def _machines(args) -> list[dict[str, Any]]:
    import os  # noqa: PLC0415

    from ..planner import load_machine  # noqa: PLC0415
    from ..planner.machine import THIS_FILE  # noqa: PLC0415

    names = args.machine or (["this"] if os.path.isfile(THIS_FILE) else ["gtx680-fdr"])
    return [load_machine(n) for n in names]


def _load(path: str, overrides: list[str]):
    from . import run as run_spec  # noqa: PLC0415

    return run_spec.read(path, overrides)


def _check_args(args) -> None:
    from ..bench.common import check_output_path  # noqa: PLC0415

    for name in ("ranks", "replicas", "ranks_per_node"):
        v = getattr(args, name)
        for x in (v if isinstance(v, list) else [v] if v is not None else []):
            if x < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {x}")
    if args.grid and min(args.grid) < 1:
        raise ValueError(f"--grid must be two integers >= 1, got {args.grid[0]} {args.grid[1]}")
    if not args.table and (len(args.config) > 1 or (args.ranks and len(args.ranks) > 1)
                           or (args.machine and len(args.machine) > 1)):
        raise ValueError("several configs, --ranks or --machine values need --table")
    if args.stage is not None and args.stage < 0:
        raise ValueError(f"--stage must be >= 0, got {args.stage}")
    err = check_output_path(args.json)
    if err:
        raise ValueError(err)


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    machines = _machines(args)
    out = _table(args, machines) if args.table else _single(args, machines[0])
    if args.json:
        from ..io.atomic import write_atomic  # noqa: PLC0415

        write_atomic(args.json, json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")
    if not args.table and out["error"]:
        raise ValueError(f"{args.config[0]}: {out['error']}")
    return 0


def _layout(args, spec) -> tuple[int, int, tuple[int, int] | None]:
    """(ranks, replicas, grid or None) from the options and the config."""
    reps = args.replicas or spec.parallel.replicas
    grid = tuple(args.grid) if args.grid else spec.parallel.grid
    ranks = args.ranks[0] if args.ranks else (grid[0] * grid[1] * reps if grid else reps)
    if ranks % reps:
        raise ValueError(f"--ranks {ranks} is not a multiple of the replicas {reps}")
    if grid and grid[0] * grid[1] * reps != ranks:
        raise ValueError(f"grid {grid[0]}x{grid[1]} x {reps} replica(s) is {grid[0] * grid[1] * reps} ranks, "
                         f"not --ranks {ranks}")
    return ranks, reps, grid


def _stages(args, net) -> list[int]:
    if args.stage is None:
        return list(range(len(net.stages)))
    if args.stage >= len(net.stages):
        raise ValueError(f"--stage {args.stage}: the network has {len(net.stages)} stage(s)")
    return [args.stage]


def _overlap_setting(args, spec) -> tuple[bool | str, str]:
    """(True, False or "auto", where that comes from)."""
    if args.overlap:
        return {"on": True, "off": False, "auto": "auto"}[args.overlap], "--overlap"
    return spec.parallel.overlap, "the config"


def _overlap(args, spec, net, batch, ranks, grid, reps, machine, stages, kw) -> dict[str, Any]:
    """The overlap a plan predicts with: the one given, or what "auto" chooses here (and why)."""
    from ..planner.overlap import choose_overlap  # noqa: PLC0415

    setting, source = _overlap_setting(args, spec)
    if setting != "auto":
        why = f"--overlap {args.overlap}" if source == "--overlap" else "set in the config"
        return {"on": bool(setting), "setting": setting, "source": source, "reason": why,
                "seconds_on": None, "seconds_off": None}
    choice = choose_overlap(net, batch, ranks, grid, reps, machine, stages=stages, **kw)
    return {"setting": "auto", "source": source, **choice.as_dict()}


def _fuse(args, spec, net, batch, ranks, grid, reps, machine, kw) -> dict[str, Any]:
    """The stages whose pool and LCN share one exchange, and those whose frozen filter joins them: the
    config's (or --fuse, --fuse-filter), or what "auto" chooses."""
    from ..planner.fuse import choose_fuse, resolve, resolve_filter, undecided  # noqa: PLC0415

    given_filter = getattr(args, "fuse_filter", None)
    setting = args.fuse or spec.parallel.fuse
    fsetting = given_filter or spec.parallel.fuse_filter
    fixed = resolve(setting, len(net.stages))
    filters = resolve_filter(fsetting, len(net.stages), fixed)
    if not undecided(fixed, filters):
        why = ", ".join(f"{flag} {given}" if given else f"{key} set in the config" for flag, given, key in (
            ("--fuse", args.fuse, "parallel.fuse"), ("--fuse-filter", given_filter, "parallel.fuse_filter")))
        return {"setting": setting, "filter_setting": fsetting, "stages": list(fixed), "filters": list(filters),
                "reason": why}
    choice = choose_fuse(net, batch, ranks, grid, reps, machine, fused=fixed, filters=filters, **kw)
    return {"setting": "auto", "filter_setting": fsetting, "stages": list(choice.stages),
            "filters": list(choice.filters), "reason": choice.describe(),
            "seconds": choice.as_dict()["seconds"], "predicted": list(choice.predicted)}


def _overlap_text(ov: dict[str, Any]) -> str:
    """``on (auto: <why>)`` or ``off (set in the config)``."""
    return f"{'on' if ov['on'] else 'off'} ({'auto: ' if ov['setting'] == 'auto' else ''}{ov['reason']})"


#: The memory line's categories, in order (``planner.model.memory``; those that are 0 are left out).
MEMORY_CATEGORIES = ("weights", "gradients", "optimizer", "activations", "buffers", "temporaries", "reader",
                     "diagnostics", "runtime")


def _mib(b: float) -> str:
    return f"{b / 2**20:,.1f}"


def _single(args, machine) -> dict[str, Any]:
    from ..planner import fit_error, predict_step, smallest_fit, suggest  # noqa: PLC0415
    from ..planner.machine import load_warning  # noqa: PLC0415
    from ..planner.predict import RANK_COUNTS  # noqa: PLC0415

    path = args.config[0]
    spec = _load(path, args.set)
    net, slots = spec.network, spec.train.optimizer_slots
    ranks, reps, grid = _layout(args, spec)
    batch, tied, dtype = spec.data.batch, spec.train.tied, spec.train.dtype.name
    kw = dict(dtype=dtype, optimizer_slots=slots, ranks_per_node=args.ranks_per_node, tied=tied)
    stages = _stages(args, net)
    ov = _overlap(args, spec, net, batch, ranks, grid, reps, machine, stages, kw)
    kw["overlap"] = ov["on"]
    fu = _fuse(args, spec, net, batch, ranks, grid, reps, machine, kw)
    preds = [predict_step(net, batch, ranks, grid, reps, machine, stage=k, reduction=spec.parallel.reduction,
                          fuse=fu["stages"], fuse_filter=fu["filters"], **kw) for k in stages]
    p0 = preds[0]
    print(f"plan: {path}: {net!r}")
    print(f"  {ranks} rank(s) = {reps} replica(s) x grid {p0['grid'][0]}x{p0['grid'][1]}; batch {batch} per replica; "
          f"{dtype}; {'tied' if tied else 'untied'} weights; optimizer {spec.train.optimizer['kind']} "
          f"({slots} slot(s)); {p0['ranks_per_node']} rank(s) per node")
    print(f"  machine {machine['name']} ({machine['kind']}): {machine['source']}")
    warning = load_warning(machine, ranks_per_node=p0["ranks_per_node"])
    if warning:
        print(f"  {warning}")
    print(f"  overlap {_overlap_text(ov)}")
    print(f"  pool and LCN fused (one exchange) in stage(s) {', '.join(map(str, fu['stages'])) or 'none'}; "
          f"with the filter too while frozen (one exchange of the stage's input) in stage(s) "
          f"{', '.join(map(str, fu['filters'])) or 'none'} ({'auto: ' if fu['setting'] == 'auto' else ''}{fu['reason']})")
    print(f"\n  {'layer':<9}{'out shape (H,W,C)':>20}{'params':>15}{'params/rank':>14}{'weights MiB/rank':>18}")
    for lay in p0["layers"]:
        print(f"  {lay['index']:>2} {lay['kind'] + str(lay['stage']):<6}{str(tuple(lay['out_shape'][:3])):>20}"
              f"{lay['params']:>15,}{lay['params_per_rank_max']:>14,}"
              f"{_mib(lay['memory_worst_rank']['weights']):>18}")
    print(f"  {'total':<29}{sum(l['params'] for l in p0['layers']):>15,}")
    for p in preds:
        print(f"\n  training step of stage {p['stage']} (per rank, the busiest; memory of rank {p['memory_rank']}):")
        print(f"  {'layer':<9}{'GFLOP':>10}{'act MiB':>10}{'opt MiB':>10}{'buf MiB':>9}{'halo MiB':>10}{'msgs':>6}"
              f"{'compute ms':>12}{'exchange ms':>13}")
        for lay in p["layers"]:
            m = lay["memory_worst_rank"]
            if lay["seconds"] == 0 and not m["activations"]:
                continue
            print(f"  {lay['index']:>2} {lay['kind'] + str(lay['stage']):<6}{lay['flops_per_rank_max'] / 1e9:>10.3f}"
                  f"{_mib(m['activations']):>10}{_mib(m['optimizer']):>10}{_mib(m['buffers']):>9}"
                  f"{lay['halo_bytes_per_rank_max'] / 2**20:>10.2f}{lay['halo_messages_per_rank_max']:>6}"
                  f"{lay['compute_s'] * 1e3:>12.2f}{lay['exchange_s'] * 1e3:>13.2f}")
        mem, wh = p["memory"], p["weight_halo"]
        if wh["bytes_kept"]:
            print(f"  frozen stage(s) {', '.join(map(str, p['fuse_filter']))} with the filter fused: weight halo "
                  f"{_mib(wh['bytes_kept'])} MiB kept (in weights), fetched once a stage ({_mib(wh['bytes_fetched'])} "
                  f"MiB in {wh['messages_fetched']} message(s), not per step)")
        print(f"  step {p['seconds'] * 1e3:.1f} ms = compute {p['compute_s'] * 1e3:.1f} + exchange "
              f"{p['exchange_s'] * 1e3:.1f} + allreduce {p['reduce_s'] * 1e3:.1f}; {p['images_per_s']:.1f} images/s; "
              f"{p['flops_per_rank_max'] / 1e9:.2f} GFLOP and {p['halo_bytes_per_rank_max'] / 2**20:.2f} MiB of halo "
              f"per rank")
        print(f"  memory {mem['total'] / 2**30:.3f} GiB of {p['device_memory_bytes'] / 2**30:.2f} GiB per rank "
              f"({', '.join(f'{k} {mem[k] / 2**30:.3f}' for k in MEMORY_CATEGORIES if k in mem and mem[k])})"
              + ("" if p["fits"] else "  DOES NOT FIT"))
    sugg = suggest(net, batch, ranks, machine, replicas=args.replicas, stages=stages, **kw)
    print(f"\n  splits of {ranks} rank(s), best first (time of one step of each stage, summed):")
    for c in sugg[:6]:
        print(f"    {c['replicas']:>3} replica(s) x grid {c['grid'][0]}x{c['grid'][1]}: {c['seconds'] * 1e3:9.1f} ms, "
              f"{c['images_per_s']:8.1f} images/s, {c['memory_bytes'] / 2**30:.2f} GiB"
              + ("" if c["fits"] else "  (does not fit)"))
    best = sugg[0]
    print(f"  suggested: {best['replicas']} replica(s) x grid {best['grid'][0]}x{best['grid'][1]}"
          + ("" if best["fits"] else " (nothing fits)"))
    error = next((e for e in (fit_error(net, p) for p in preds) if e), None)
    fit = None
    if not best["fits"]:  # say how many ranks it takes, not only that this many are too few
        fit = smallest_fit(net, batch, machine, replicas=reps, stages=stages,
                           counts=[n for n in RANK_COUNTS if n > ranks], **kw)
        if fit is None:
            more = f"; it does not fit on up to {RANK_COUNTS[-1]} ranks of {machine['name']} either"
        else:
            more = (f"; it fits on {fit['ranks']} ranks ({fit['replicas']} replica(s) x grid {fit['grid'][0]}x"
                    f"{fit['grid'][1]}, {fit['memory_bytes'] / 2**30:.2f} GiB per rank): cotsdl plan {path} "
                    f"--ranks {fit['ranks']}")
        print("  fewest ranks that fit: " + (f"{fit['ranks']}" if fit else "none") + f" (of {machine['name']})")
        error = (error or "does not fit") + more
    return {"config": path, "machine": machine, "load_warning": warning, "overlap": ov, "fuse": fu, "predictions": preds,
            "suggestions": sugg, "error": error, "fits_on": fit}


def _table(args, machines) -> dict[str, Any]:
    from ..planner import suggest  # noqa: PLC0415
    from ..planner.machine import load_warning  # noqa: PLC0415

    ranks_list = args.ranks or [1]
    warnings = {m["name"]: w for m in machines for w in [load_warning(m)] if w}
    for w in warnings.values():
        print(w)
    rows = []
    hdr = f"{'config':<22}{'params':>8}{'GPUs':>6}" + "".join(
        f"  | {m['name'][:12]:<12}{'grid':>6}{'s/step':>9}{'GiB/GPU':>9}{'halo %':>8}{'overlap':>8}      "
        for m in machines)
    print("predicted time of one training step of each stage (summed), memory per rank (largest stage), "
          "share of the step spent in halo exchange, overlap (as given, or what auto chooses on that grid: JSON "
          "says why); the best model grid of the GPUs, 1 replica unless --replicas")
    print(hdr)
    loaded = [(path, _load(path, args.set)) for path in args.config]
    loaded.sort(key=lambda t: sum(lay.params for lay in _counts(t[1].network)))  # smallest network first
    for path, spec in loaded:
        net, slots = spec.network, spec.train.optimizer_slots
        batch, tied, dtype = spec.data.batch, spec.train.tied, spec.train.dtype.name
        params = sum(lay.params for lay in _counts(net))
        for ranks in ranks_list:
            line = f"{path.rsplit('/', 1)[-1].removesuffix('.toml'):<22}{_short(params):>8}{ranks:>6}"
            for m in machines:
                kw = dict(dtype=dtype, optimizer_slots=slots, ranks_per_node=args.ranks_per_node, tied=tied)
                setting = _overlap_setting(args, spec)[0]
                reps = args.replicas or 1
                if ranks % reps:
                    raise ValueError(f"--ranks {ranks} is not a multiple of --replicas {reps}")
                # "auto" decides on the grid that is best without overlap (the grid is chosen first)
                best = suggest(net, batch, ranks, m, replicas=reps, stages=_stages(args, net),
                               overlap=setting is True, **kw)[0]
                ov = _overlap(args, spec, net, batch, ranks, best["grid"], best["replicas"], m, _stages(args, net), kw)
                row = _table_row(net, batch, ranks, best, m, args, {**kw, "overlap": ov["on"]})
                row.update(config=path, params=params, overlap=ov)
                rows.append(row)
                line += (f"  | {'':<12}{'%dx%d' % tuple(best['grid']):>6}{row['seconds']:>9.3f}"
                         f"{row['memory_bytes'] / 2**30:>9.2f}{100 * row['halo_share']:>7.1f}%"
                         f"{'on' if ov['on'] else 'off':>8}" + ("" if row["fits"] else " NOFIT").ljust(6))
            print(line + _paper_note(params, ranks))
    print("NOFIT: does not fit in device memory.  GPU efficiencies: measured on one H100 (h100-ndr) and one H200 "
          "(h200-ndr), assumed the H100's fractions of peak on the other GPUs.")
    print(PAPER)
    return {"rows": rows, "paper": PAPER, "machines": machines, "load_warnings": warnings}


def _counts(net):
    from ..planner.model import layer_counts  # noqa: PLC0415

    return layer_counts(net, 1, (1, 1))


def _table_row(net, batch, ranks, best, machine, args, kw) -> dict[str, Any]:
    from ..planner import predict_step  # noqa: PLC0415

    preds = [predict_step(net, batch, ranks, best["grid"], best["replicas"], machine, stage=k, **kw)
             for k in _stages(args, net)]
    secs = sum(p["seconds"] for p in preds)
    return {"ranks": ranks, "machine": machine["name"], "grid": best["grid"], "replicas": best["replicas"],
            "seconds": secs, "stage_seconds": [p["seconds"] for p in preds],
            "halo_share": sum(p["exchange_s"] for p in preds) / secs,
            "memory_bytes": max(p["memory_bytes"] for p in preds), "fits": all(p["fits"] for p in preds)}


def _paper_note(params: int, ranks: int) -> str:
    """What the paper states for this size and GPU count (only two pairs are stated)."""
    if ranks == 12 and 0.8e9 <= params <= 1.5e9:
        return "  paper: ~1B on 12 GPUs (3 machines), trained in a couple of days"
    if ranks == 64 and params >= 10e9:
        return "  paper: 11.2B on 64 GPUs (16 machines)"
    return ""


def _short(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"
