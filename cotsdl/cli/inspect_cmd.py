"""``cotsdl inspect FILE [--config CONFIG]``: what a dataset file holds, and whether a config can train on it."""
from __future__ import annotations

import numpy as np



def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="what an HDF5 dataset holds and whether it is valid for a config",
                       description="Print what an HDF5 image dataset holds (images, labels, kinds, groups, statistics, "
                                   "recipe) and its problems; with --config, whether that config can train on it. "
                                   "Exit status 0 when valid, 2 when not.")
    p.add_argument("file", help="HDF5 dataset")
    p.add_argument("--config", help="a training config: check the file against its network and batch")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE", help="override a config key")
    p.add_argument("--scan", action="store_true", help="also read every pixel: value range, NaN/Inf")


def _scan(path: str) -> tuple[list[str], list[int]]:
    import h5py  # noqa: PLC0415

    out, lo, hi, bad = [], np.inf, -np.inf, []
    with h5py.File(path, "r") as f:
        d = f["images"]
        for i in range(0, d.shape[0], 256):
            try:
                x = d[i:i + 256]
            except OSError as e:
                from ..io.dataset import DatasetError  # noqa: PLC0415

                raise DatasetError(f"dataset {path}: cannot read images {i}..{min(i + 256, d.shape[0]) - 1} "
                                   f"(truncated or corrupt?): {e}") from None
            flat = x.reshape(len(x), -1)
            fin = np.isfinite(flat).all(axis=1) if x.dtype.kind == "f" else np.ones(len(x), bool)
            bad += [i + int(j) for j in np.flatnonzero(~fin)]
            if fin.any():
                lo, hi = min(lo, float(flat[fin].min())), max(hi, float(flat[fin].max()))
    out.append(f"  pixel values: {lo:g} .. {hi:g} (as stored)")
    return out, bad


def run(args) -> int:
    from ..io import dataset  # noqa: PLC0415

    info = dataset.inspect(args.file)  # a missing or unreadable file raises DatasetError (exit 2)
    print(info.summary())
    problems = list(info.problems)
    if args.config:
        from . import run as run_spec  # noqa: PLC0415

        spec = run_spec.read(args.config, args.set)
        problems = dataset.check_for_network(info, spec.network.input_shape, spec.global_batch,
                                             spec.data.preprocess != "none")
    if args.scan and not info.problems:
        lines, bad = _scan(args.file)
        print("\n".join(lines))
        if bad:
            problems.append(f"{len(bad)} image(s) with NaN or Inf values, e.g. image {bad[0]}")
    if problems:
        print("NOT VALID" + (f" for {args.config}" if args.config else "") + ":")
        for p in problems:
            print(f"  - {p}")
        return 2
    print("valid" + (f" for {args.config}" if args.config else ""))
    return 0
