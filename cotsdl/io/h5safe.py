"""What an HDF5 file may not do to the process that reads it: read other files, or declare more than it holds.

A dataset or checkpoint file is read on every rank.  HDF5 lets a file point
elsewhere — external links (another file's object), virtual datasets (mapped from
other files) and external raw storage (a dataset's bytes in other files) — so a
file could make every rank read arbitrary files; cotsdl writes none of these and
refuses them, naming the object.  A dataset's declared size is bounded by what the
file stores: a contiguous dataset must fit in the file, a chunked one must have
every chunk written (a header that declares 2^40 images over a few kilobytes is a
damaged or hand-made file, not a dataset).
"""
from __future__ import annotations

import os

import h5py


def storage_problems(f: h5py.File) -> list[str]:
    """Objects of ``f`` that read outside it, and datasets that declare more than the file holds."""
    out: list[str] = []
    size = os.fstat(f.id.get_vfd_handle()).st_size if f.driver in ("sec2", "stdio") else None

    def walk(group: h5py.Group, prefix: str) -> None:
        for name in group:  # names only: iterating does not resolve links
            path = f"{prefix}/{name}"
            link = group.get(name, getlink=True)
            if isinstance(link, h5py.ExternalLink):
                out.append(f"'{path}' is an external link (to {link.filename}:{link.path})")
                continue
            if isinstance(link, h5py.SoftLink):
                continue  # a name for an object of this same file
            obj = group.get(name)
            if isinstance(obj, h5py.Group):
                walk(obj, path)
            elif isinstance(obj, h5py.Dataset):
                problem = _dataset_problem(obj, path, size)
                if problem:
                    out.append(problem)

    walk(f, "")
    return out


def _dataset_problem(d: h5py.Dataset, path: str, file_size: int | None) -> str | None:
    if d.is_virtual:
        return f"'{path}' is a virtual dataset (it maps data from other files)"
    if d.external:
        return f"'{path}' keeps its bytes in external file(s) ({d.external[0][0]}...)"
    declared = d.size * d.dtype.itemsize
    if d.chunks is None:
        offset = d.id.get_offset()
        if declared and (offset is None or (file_size is not None and offset + declared > file_size)):
            return (f"'{path}' declares {d.shape} ({declared} bytes) but the file holds {file_size} bytes "
                    "(truncated or damaged)")
        return None
    per_chunk = [-(-n // c) for n, c in zip(d.shape, d.chunks)]
    expected = 1
    for n in per_chunk:
        expected *= n
    stored = d.id.get_num_chunks()
    if stored < expected:
        return (f"'{path}' declares {d.shape} in {expected} chunk(s) but the file stores {stored} "
                "(truncated, unfinished or damaged)")
    return None
