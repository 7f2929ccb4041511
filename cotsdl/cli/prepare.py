"""``cotsdl prepare-data``: build dataset files (one process, no MPI).

    cotsdl prepare-data natural OUT --count N --size H W [--channels 1|3] [--face-fraction F | --mix-faces K] ...
    cotsdl prepare-data faces OUT --size H W [--mixable M] [--views V] [--photo-crops D] ...
    cotsdl prepare-data folder SRC OUT --size H W [--mode crop|resize]
    cotsdl prepare-data synthetic OUT --count N --size H W [--dtype float32|uint8] [--labels]
    cotsdl prepare-data resize SRC OUT --size H W [--channels 1|3] [--mode crop|resize]
    cotsdl prepare-data stats FILE

Give ``natural`` and ``faces`` the same ``--face-split-seed`` and ``--mixable``: then
no face of the evaluation set is in the training set, and no LFW non-face of it in a
matched control's (``natural --no-faces --nonface-fraction F``).
"""
from __future__ import annotations

import argparse
import inspect
import signal
import sys
import time

from .. import stops


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return v


def _non_negative(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text}")
    return v


#: The dataset builders of ``cotsdl.io.builders``: name -> what it makes.  The one list: the
#: parser, its usage line and the dispatch come from here (a builder's options are the
#: keyword arguments of its function, by name).
BUILDERS = {
    "natural": "random crops of scikit-image's bundled photographs (unlabeled)",
    "faces": "labeled evaluation set: views of held-out LFW faces (1) vs LFW non-faces, held-out photo crops, "
             "phase-scrambled faces and crops matched to a face's mean and contrast (0)",
    "folder": "a folder of your own images",
    "synthetic": "small generated images (blobs and gratings) for tests",
    "resize": "another dataset file at another image size (labels kept)",
}


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``prepare-data`` subcommand (and its builders) to an argparse ``subparsers``."""
    p = subparsers.add_parser("prepare-data", help="build an HDF5 image dataset (natural, faces, folder, synthetic) "
                              "or add per-image statistics to one",
                              description="Build an HDF5 image dataset on one process (no MPI), or add per-image "
                              "statistics to one.")
    sub = p.add_subparsers(dest="builder", required=True, metavar="{" + ",".join([*BUILDERS, "stats"]) + "}")

    def builder(name: str, count: bool = False, seed: bool = True, mode: bool = True):
        b = sub.add_parser(name, help=BUILDERS[name], description=BUILDERS[name])
        if name == "folder":
            b.add_argument("src_folder", metavar="SRC", help="folder of PNG/JPEG images (sorted by path)")
            b.add_argument("--recursive", action="store_true", help="read its subfolders too (else they are skipped, "
                           "and said so)")
        b.add_argument("out", metavar="OUT", help="the HDF5 file to write (replaced only when complete)")
        if count:
            b.add_argument("--count", type=_positive, required=True, metavar="N", help="number of images")
        b.add_argument("--size", type=_positive, nargs=2, metavar=("H", "W"), required=True, help="image size")
        b.add_argument("--channels", type=int, choices=[1, 3], default=1, help="1 (grayscale, default) or 3 (RGB)")
        if seed:
            b.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
        if mode:
            b.add_argument("--mode", choices=["crop", "resize"], default="crop",
                           help="where aspect ratios differ: center-crop then resize (default), or plain resize")
        b.add_argument("--compression", choices=["none", "gzip", "lzf"], default="none")
        return b

    def face_split_options(b):
        b.add_argument("--face-split-seed", type=int, default=0, metavar="SEED",
                       help="seed of the LFW face split (default 0)")
        b.add_argument("--mixable", type=_non_negative, default=50, metavar="M",
                       help="LFW faces that may go into training data; the other 100-M are held out (default 50)")

    n = builder("natural", count=True)
    n.add_argument("--scale", type=float, nargs=2, metavar=("LO", "HI"), default=[0.5, 1.0],
                   help="crop side as a fraction of the photo's shorter side (default 0.5 1.0)")
    n.add_argument("--no-flip", dest="flip", action="store_false", help="no random horizontal flips")
    n.add_argument("--face-fraction", type=float, default=0.0, metavar="F",
                   help="0 <= F < 1: round(F * count) images are augmented views (flip, shift, scale, rotation, "
                        "contrast, brightness) of the mixable LFW faces (default 0)")
    n.add_argument("--mix-faces", type=_non_negative, default=0, metavar="K",
                   help="mix this many LFW faces of the mixable part, unaugmented, into the images (default 0)")
    n.add_argument("--no-faces", action="store_true",
                   help="leave out every face (the photographs that show one): the no-face control's training set")
    n.add_argument("--nonface-fraction", type=float, default=0.0, metavar="F",
                   help="with --no-faces: the matched control's training set; the round(F * count) images that "
                        "--face-fraction F makes face views are views of the mixable LFW non-faces instead, with "
                        "the same augmentation, positions and draws (default 0)")
    face_split_options(n)
    f = builder("faces")
    face_split_options(f)
    f.add_argument("--views", type=_positive, default=8, metavar="V",
                   help="augmented views of each held-out face (default 8: 400 faces with --mixable 50)")
    f.add_argument("--lfw-nonfaces", type=_non_negative, default=None, metavar="K",
                   help="LFW non-faces among the distractors, at most the 100-M held out from training "
                        "(default: all of them, 50 with --mixable 50)")
    f.add_argument("--photo-crops", type=_non_negative, default=100, metavar="K",
                   help="random crops of the held-out photographs (default 100)")
    f.add_argument("--phase-scrambled", type=_non_negative, default=100, metavar="K",
                   help="face views with random Fourier phases, same amplitude spectrum (default 100)")
    f.add_argument("--matched-crops", type=_non_negative, default=100, metavar="K",
                   help="held-out photo crops given the mean and contrast of a random face view (default 100)")
    builder("folder", seed=False)
    s = builder("synthetic", count=True, mode=False)
    s.add_argument("--dtype", choices=["float32", "uint8"], default="float32")
    s.add_argument("--labels", action="store_true", help="store labels (1 = the image has a grating)")
    r = sub.add_parser("resize", help=BUILDERS["resize"],
                       description="Write a copy of a dataset file at another image size, for a network whose "
                                   "input differs from the file's images (labels kept; uint8 stays uint8).")
    r.add_argument("src_path", metavar="SRC", help="the dataset file to convert")
    r.add_argument("out", metavar="OUT", help="the HDF5 file to write (replaced only when complete)")
    r.add_argument("--size", type=_positive, nargs=2, metavar=("H", "W"), required=True, help="image size")
    r.add_argument("--channels", type=int, choices=[1, 3], help="1 or 3 (default: as in SRC)")
    r.add_argument("--mode", choices=["crop", "resize"], default="crop",
                   help="where aspect ratios differ: center-crop then resize (default), or plain resize")
    r.add_argument("--compression", choices=["none", "gzip", "lzf"], default="none")
    st = sub.add_parser("stats", help="add per-image statistics (image_mean, image_std) to a file that lacks them")
    st.add_argument("file", metavar="FILE")
    st.add_argument("--force", action="store_true", help="recompute them when the file has them already")
    return p


def _build(args) -> str:
    from ..io import builders  # noqa: PLC0415 - h5py only when the command runs

    fn = getattr(builders, args.builder)
    kw = {k: v for k, v in vars(args).items() if k in inspect.signature(fn).parameters and k != "path"}
    kw["compression"] = None if getattr(args, "compression", "none") == "none" else args.compression
    fn(args.out, **kw)
    return args.out


def _describe(path: str) -> str:
    from ..io.dataset import inspect  # noqa: PLC0415

    info = inspect(path)
    h, w, c = info.image_shape
    text = f"{path}: {info.count} images {h}x{w}x{c} {info.dtype}"
    if info.labels is not None:
        text += ", labels " + ", ".join(f"{k}: {v}" for k, v in sorted(info.labels.items()))
    if info.kinds is not None:
        text += " (" + ", ".join(f"{k} {v}" for k, v in info.kinds.items()) + ")"
    if info.groups is not None:
        text += f", {info.groups} groups"
    return text


def run(args) -> int:
    """Run a parsed ``prepare-data`` command; 0 on success, 2 on bad input, 1 when the disk fails
    (full, quota, a write error): one message on stderr either way."""
    from ..io.atomic import DiskError  # noqa: PLC0415
    from ..io.dataset import DatasetError  # noqa: PLC0415

    t0 = time.perf_counter()

    class Stopped(Exception):
        pass

    def stop(signum, frame):  # unwind: the writers remove their temporary files on the way out
        stops.raise_stop(Stopped(signum))  # remembered: re-raised at the next batch if a callback swallows it

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if args.builder == "stats":
            from ..io.builders import add_stats  # noqa: PLC0415

            if not add_stats(args.file, force=args.force):
                print(f"{args.file} has image_mean and image_std already (--force recomputes them)")
                return 0
            print(f"added image_mean, image_std to {_describe(args.file)} in {time.perf_counter() - t0:.1f} s")
            return 0
        path = _build(args)
        print(f"wrote {_describe(path)} in {time.perf_counter() - t0:.1f} s")
        return 0
    except (DatasetError, ValueError, OSError) as e:
        print(f"cotsdl: error: {e}", file=sys.stderr, flush=True)
        return 1 if isinstance(e, DiskError) else 2  # a write that failed is the machine's, not bad input
    except Stopped as e:
        sig = signal.Signals(e.args[0])
        print(f"cotsdl: stopped by {sig.name}: nothing was written (no partial file is left)", file=sys.stderr,
              flush=True)
        return 128 + sig.value
    finally:
        stops.clear()  # handled, or too late to matter: nothing pending outlives the command
        for sig, handler in old.items():
            signal.signal(sig, handler)
