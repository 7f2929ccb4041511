"""HDF5 checkpoints of distributed arrays, written atomically, readable on any grid.

A checkpoint is a folder ``ckpt-<step>`` holding one HDF5 file per writing rank
(its blocks of every array, each with its box in global coordinates) and
``index.json`` (the metadata and the list of blocks).  Ranks write into a
``.ckpt-<step>.partial`` folder; after every file is written and fsynced, rank 0
writes the index and renames the folder: the rename is the commit, so a run killed
mid-write leaves the previous checkpoint as the latest.  Loading works on any number
of ranks or grid: each rank reads, from the files whose blocks intersect the boxes
it needs, just those intersections.  No pickles: arrays are HDF5 datasets, the rest
JSON.
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Sequence

import h5py
import numpy as np
from mpi4py import MPI

from .. import backend
from ..array.box import Box
from ..array.collective import raise_collectively
from .atomic import DiskError, ensure_free, write_atomic
from .h5safe import storage_problems

_NAME = re.compile(r"^ckpt-(\d{9})$")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)



def _generation(path: Path) -> tuple[int, int]:
    try:
        with open(path / "index.json") as f:
            gen = int(json.load(f).get("generation", 0))
    except (OSError, ValueError):
        gen = -1
    return gen, int(_NAME.match(path.name).group(1))


def completed(folder: str | os.PathLike) -> list[Path]:
    """Committed checkpoints in ``folder``, oldest *written* first.

    Order is by generation (a counter every save increments), not by step: a run
    resumed from an earlier checkpoint writes newer checkpoints with smaller steps
    than the abandoned run's, and those must count as the latest.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if _NAME.match(p.name) and (p / "index.json").is_file()]
    return sorted(found, key=_generation)


def latest(folder: str | os.PathLike) -> Path | None:
    done = completed(folder)
    return done[-1] if done else None


def destination_error(folder: str | os.PathLike, need: int) -> str | None:
    """Why checkpoints of ``need`` bytes cannot be written into ``folder`` (made if missing); else None."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".cotsdl-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
        free = shutil.disk_usage(folder).free
    except OSError as e:
        return f"checkpoint folder {folder} cannot be written: {e.strerror or e}"
    if free < need:
        return f"checkpoint folder {folder}: a checkpoint needs about {_size(need)}, only {_size(free)} are free"
    return None


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def save(folder: str | os.PathLike, step: int, comm: MPI.Comm, arrays: dict[str, tuple[tuple[int, ...], Box, np.ndarray]],
         meta: dict[str, Any], writer: bool = True, keep: int = 3) -> Path:
    """Write a checkpoint (collective over ``comm``); return its folder.

    ``arrays`` maps a name to (global shape, this rank's box, this rank's block); only
    ranks with ``writer`` write (e.g. one replica of identical copies).  The last
    ``keep`` checkpoints are kept.
    """
    folder = Path(folder)
    rank = comm.Get_rank()
    final, partial = folder / f"ckpt-{step:09d}", folder / f".ckpt-{step:09d}.partial"
    err = None
    if rank == 0:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            _recover_replaced(folder)
            if partial.exists():
                shutil.rmtree(partial)  # left over from a run killed while writing
            partial.mkdir()
        except OSError as e:
            err = f"cannot create checkpoint folder {partial}: {e}"
    raise_collectively(comm, err, OSError)
    pieces: list[dict[str, Any]] = []
    files: dict[str, dict[str, Any]] = {}
    if writer:
        fname = f"rank{rank:05d}.h5"
        tmp = partial / (fname + ".tmp")
        try:
            # HDF5 builds the shard in memory and Python writes it: a full disk is then an OSError
            # of one write call, never an HDF5 library that failed mid-file (and crashed at exit)
            image = io.BytesIO()
            with h5py.File(image, "w") as f:
                for name, (shape, box, data) in sorted(arrays.items()):
                    if box.is_empty:
                        continue
                    d = f.create_dataset(name, data=np.ascontiguousarray(backend.to_numpy(data)))
                    d.attrs["lo"], d.attrs["hi"] = np.array(box.lo), np.array(box.hi)
                    pieces.append({"name": name, "file": fname, "lo": list(box.lo), "hi": list(box.hi)})
            blob = image.getbuffer()
            ensure_free(partial, len(blob), str(partial / fname))
            with open(tmp, "wb") as fh:
                fh.write(blob)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, partial / fname)
            files[fname] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
            del blob
            image.close()
        except DiskError as e:  # free space checked first: the message names the file
            err = f"cannot write checkpoint: {e}"
        except Exception as e:  # noqa: BLE001 - every rank must learn of it
            text = f"{type(e).__name__}: {e}"
            code = getattr(e, "errno", None) or next((int(m) for m in re.findall(r"errno = (\d+)", text)), None)
            if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # HDF5 words it at length: say it plainly
                text = f"{os.strerror(code)} (the disk is full, a quota or a file-size limit was reached)"
            err = f"cannot write checkpoint file {partial / fname}: {text}"
    try:
        raise_collectively(comm, err, OSError)
    except OSError:
        if rank == 0:  # a full disk must not stay full of a checkpoint that will never be committed
            shutil.rmtree(partial, ignore_errors=True)
        raise
    gathered = comm.gather((pieces, files), root=0)
    shapes = {name: list(shape) for name, (shape, _, _) in arrays.items()}
    if rank == 0:
        try:
            done = completed(folder)
            generation = (_generation(done[-1])[0] + 1) if done else 1
            index = {"step": step, "generation": generation, "meta": meta, "shapes": shapes,
                     "pieces": [p for ps, _ in gathered for p in ps],
                     "files": {k: v for _, fs in gathered for k, v in fs.items()}}
            index["checksum"] = _index_checksum(index)
            write_atomic(partial / "index.json", json.dumps(index, indent=1))
            _fsync_dir(partial)
            trash = None
            if final.exists():  # the same step saved again: swap, never delete first
                trash = folder / f".ckpt-{step:09d}.replaced-{os.getpid()}"
                os.replace(final, trash)
            os.replace(partial, final)  # the commit
            _fsync_dir(folder)
            if trash is not None:
                shutil.rmtree(trash, ignore_errors=True)
            for old in completed(folder)[:-keep] if keep > 0 else []:
                shutil.rmtree(old, ignore_errors=True)
            for stale in folder.glob(".ckpt-*.partial"):  # left by runs killed while writing
                shutil.rmtree(stale, ignore_errors=True)
        except Exception as e:  # noqa: BLE001 - a failure on rank 0 alone must not hang the others
            err = f"cannot commit checkpoint {final}: {type(e).__name__}: {e}"
    raise_collectively(comm, err, OSError)
    return final


def _recover_replaced(folder: Path) -> None:
    """Undo a re-save of a step killed between its two renames: put the old copy back."""
    for trash in folder.glob(".ckpt-*.replaced-*"):
        final = folder / trash.name[1:].split(".replaced-")[0]
        if final.exists():
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(trash, final)


def _index_checksum(index: dict[str, Any]) -> str:
    """SHA-256 of the index without its checksum, in a canonical form (sorted keys)."""
    body = {k: v for k, v in index.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def read_index(path: str | os.PathLike, meta_keys: Sequence[str] = ()) -> dict[str, Any]:
    """The index of a checkpoint, checked; ``ValueError`` naming the file and the key when it is
    missing, damaged or edited: its checksum, its record of every shard (size and SHA-256), shard
    names that stay inside the checkpoint folder, and the ``meta`` keys a caller needs."""
    path = Path(path) / "index.json"
    try:
        with open(path, "rb") as f:
            index = json.loads(f.read())
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ValueError(f"{path} is damaged (not JSON: {e})") from None
    missing = [k for k in ("step", "meta", "shapes", "pieces", "files") if not isinstance(index, dict) or k not in index]
    if missing:
        raise ValueError(f"{path} is damaged or not a cotsdl checkpoint index (no {', '.join(repr(k) for k in missing)})")
    if "checksum" in index and index["checksum"] != _index_checksum(index):  # indexes before it had none
        raise ValueError(f"{path} does not match its checksum (damaged or edited)")
    files, pieces = index["files"], index["pieces"]
    if not isinstance(files, dict) or not isinstance(pieces, list) or not isinstance(index["meta"], dict):
        raise ValueError(f"{path} is damaged ('files', 'pieces' or 'meta' has the wrong type)")
    for i, piece in enumerate(pieces):
        name = piece.get("file") if isinstance(piece, dict) else None
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise ValueError(f"{path}: pieces[{i}].file = {name!r} is not a file name inside the checkpoint folder")
        if name not in files or not all(k in piece for k in ("name", "lo", "hi")):
            raise ValueError(f"{path}: pieces[{i}] ({name}) is not recorded in 'files' or lacks name/lo/hi")
    for name, rec in files.items():
        if not isinstance(rec, dict) or not isinstance(rec.get("size"), int) or not isinstance(rec.get("sha256"), str):
            raise ValueError(f"{path}: files[{name!r}] must record its size and sha256")
    absent = [k for k in meta_keys if k not in index["meta"]]
    if absent:
        raise ValueError(f"{path} is damaged: no {', '.join(f'meta.{k}' for k in absent)}")
    return index


def _digest(path: Path) -> dict[str, Any]:
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
            n += len(chunk)
    return {"size": n, "sha256": h.hexdigest()}


def verify(path: str | os.PathLike, comm: MPI.Comm | None = None, deep: bool = True) -> str | None:
    """Why checkpoint ``path`` cannot be trusted (damaged index, a shard missing, of the wrong size or,
    with ``deep``, checksum); None when it verifies.  With ``comm``, the ranks share the shards to check."""
    path = Path(path)
    rank, size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
    try:
        index = read_index(path)
        reason = None
    except ValueError as e:
        index, reason = None, str(e)
    if index is not None:
        recorded = index["files"]
        for name in sorted({p["file"] for p in index["pieces"]})[rank::size]:
            f = path / name
            if not f.is_file():
                reason = f"shard {f} is missing"
            elif f.stat().st_size != recorded[name]["size"]:
                reason = f"shard {f} has {f.stat().st_size} bytes, {recorded[name]['size']} were written"
            elif deep and _digest(f)["sha256"] != recorded[name]["sha256"]:
                reason = f"shard {f} does not match its checksum"
            if reason:
                break
    if comm is not None:
        reason = next((r for r in comm.allgather(reason) if r), None)
    return reason


def latest_verified(folder: str | os.PathLike, comm: MPI.Comm | None = None,
                    deep: bool = True) -> tuple[Path | None, list[str]]:
    """The newest checkpoint that verifies, and why each newer (or unreadable) one was skipped."""
    folder = Path(folder)
    done = completed(folder)
    unreadable = [p for p in done if _generation(p)[0] < 0]  # sorted first by their unknown generation
    skipped = [f"{p.name} skipped: {verify(p, None, False)}" for p in unreadable]
    for p in reversed([p for p in done if p not in unreadable]):
        reason = verify(p, comm, deep)
        if reason is None:
            return p, skipped
        skipped.append(f"{p.name} skipped: {reason}")
    return None, skipped


def load(path: str | os.PathLike, comm: MPI.Comm, wanted: dict[str, Box], dtype: Any = None) -> dict[str, np.ndarray]:
    """This rank's block ``wanted[name]`` of every named array, from any layout (collective)."""
    path = Path(path)
    err = None
    out: dict[str, np.ndarray] = {}
    try:
        index = read_index(path)
        files: dict[str, h5py.File] = {}
        try:
            for name, box in wanted.items():
                if name not in index["shapes"]:
                    raise KeyError(f"checkpoint {path} has no array {name!r}")
                gshape = tuple(index["shapes"][name])
                if not Box.from_shape(gshape).contains(box):
                    raise ValueError(f"{name}: box {box} lies outside the saved array of shape {gshape}")
                block = None
                covered = 0
                for p in index["pieces"]:
                    if p["name"] != name:
                        continue
                    part = Box(p["lo"], p["hi"]) & box
                    if part.is_empty:
                        continue
                    if p["file"] not in files:
                        files[p["file"]] = h5py.File(path / p["file"], "r")
                        bad = storage_problems(files[p["file"]])
                        if bad:  # a shard must not make every rank read other files
                            raise ValueError(f"checkpoint shard {path / p['file']}: " + "; ".join(bad))
                    ds = files[p["file"]][name]
                    if block is None:
                        block = np.zeros(box.shape, dtype or ds.dtype)
                    block[part.slices_in(box)] = ds[part.slices_in(Box(p["lo"], p["hi"]))]
                    covered += part.size
                if covered != box.size:
                    raise ValueError(f"{name}: checkpoint {path} covers {covered} of the {box.size} elements of {box}")
                out[name] = block if block is not None else np.zeros(box.shape, dtype or np.float32)
        finally:
            for f in files.values():
                f.close()
    except (OSError, KeyError, ValueError) as e:
        err = f"cannot load checkpoint {path}: {e}"
    raise_collectively(comm, err)
    return out
