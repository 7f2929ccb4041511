"""Native kernels of the numpy backend, in C++: pooling's and LCN's element-wise passes, and
the filter's products.

numpy makes one memory pass per operation (five for a pooling forward, about seven
for an LCN); ``kernels.cpp`` reads and writes each array once per pass, over the
same row bands and thread pool as the numpy code, and gives the same bits (same
summation order, no FMA contraction).  ``filter.cpp`` runs the filter's three passes
as register-tiled products that read x, w and dy in place (numpy gathers the fields
first, then calls BLAS per band of sites); it agrees with the numpy path to rounding.
The numpy path stays, and is what runs when the kernels are off:

``COTSDL_NATIVE``
    ``auto`` (default): built on first use with the C++ compiler (``CXX``, else
    ``g++``/``c++``) and used; if that fails, one warning and the numpy path.
    ``0``: never.  ``1``: required (a failed build raises).

The library is cached under :func:`~cotsdl.cudaemu.build.kernel_cache` ``("native")``,
keyed by the source, flags, compiler and this CPU's instruction sets (it is built
with ``-march=native``, so a login node and a compute node of another CPU build their
own).  Concurrent ranks may build at once: each writes a temporary and renames it.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import tempfile
import threading
import warnings
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ....cudaemu.build import compiler, kernel_cache

HERE = Path(__file__).resolve().parent
#: kernels.cpp: pooling and LCN (same bits as numpy); filter.cpp: the filter's products (FMAs, BLAS-like rounding)
SOURCES = (HERE / "kernels.cpp", HERE / "filter.cpp")
FLAGS = ["-std=c++17", "-O3", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared", "-fvisibility=hidden"]
_TUNE = [["-march=native"], []]  # tried in order: this CPU's vector units, else the compiler's default

_EXPORT = re.compile(r"COTSDL_EXPORT void cotsdl_(\w+)_##S\(([^)]*)\)")


def signatures(source: str) -> dict[str, str]:
    """Argument kinds of each exported kernel, read from its declaration in ``source``:
    ``p`` pointer, ``i`` integer (``idx``), ``s`` scalar of the array's dtype (``T``)."""
    out = {}
    for name, params in _EXPORT.findall(source):
        kinds = []
        for param in " ".join(params.replace("\\", " ").split()).split(","):
            ctype = param.strip().rsplit(" ", 1)[0]
            kinds.append("p" if "*" in param else {"idx": "i", "T": "s"}[ctype])
        out[name] = "".join(kinds)
    return out


_SUFFIX = {np.dtype(np.float32): ("f32", ctypes.c_float), np.dtype(np.float64): ("f64", ctypes.c_double)}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_failed: str | None = None
_override: bool | None = None
_mode: str | None = None
_kernels: dict[tuple[str, np.dtype], Callable[..., None]] = {}


@lru_cache(maxsize=1)
def _signatures() -> dict[str, str]:
    return {k: v for src in SOURCES for k, v in signatures(src.read_text()).items()}


def mode() -> str:
    """``COTSDL_NATIVE``: ``auto``, ``0`` or ``1``, read once per process (:func:`reset` reads it again)."""
    global _mode
    if _mode is None:
        value = os.environ.get("COTSDL_NATIVE", "auto").strip().lower() or "auto"
        if value not in ("auto", "0", "1"):
            raise ValueError(f"COTSDL_NATIVE must be auto, 0 or 1, got {value!r}")
        _mode = value
    return _mode


def reset() -> None:
    """Read ``COTSDL_NATIVE`` again at the next call (a built library stays loaded)."""
    global _mode
    _mode = None


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return os.uname().machine


def build() -> Path:
    """Build (or find in the cache) the kernels' shared library; its path."""
    try:
        cxx = compiler()
    except RuntimeError:
        raise RuntimeError("no C++ compiler (g++ or c++) on PATH; set CXX") from None
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    sources = [src.read_text() for src in SOURCES]
    folder = kernel_cache("native")
    folder.mkdir(parents=True, exist_ok=True)
    errors = []
    for tune in _TUNE:
        key = hashlib.sha256("\0".join([*sources, *FLAGS, *tune, version, _cpu_flags()]).encode()).hexdigest()[:24]
        lib = folder / f"kernels-{key}.so"
        if lib.exists():
            return lib
        with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as tmp:
            out = Path(tmp) / "kernels.so"
            cmd = [cxx, *FLAGS, *tune, *map(str, SOURCES), "-o", str(out)]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode == 0:
                os.replace(out, lib)
                return lib
            errors.append(f"{' '.join([cxx, *FLAGS, *tune])}: {res.stderr.strip()[:2000]}")
    names = " and ".join(str(src) for src in SOURCES)
    raise RuntimeError(f"building {names} failed:\n" + "\n".join(errors))


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None when they are off (``COTSDL_NATIVE=0``, :func:`use`) or did not build."""
    global _lib, _failed
    if _override is False or (_override is None and mode() == "0"):
        return None
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None and _failed is None:
            try:
                _lib = ctypes.CDLL(str(build()))
            except (OSError, RuntimeError) as e:
                _failed = str(e)
                if mode() != "1":
                    first = str(e).strip().splitlines()[0][:300]
                    warnings.warn(f"cotsdl: native CPU kernels unavailable, using the numpy path ({first}; "
                                  "COTSDL_NATIVE=1 shows the whole error, COTSDL_NATIVE=0 silences this)",
                                  RuntimeWarning, stacklevel=2)
        if _lib is None and mode() == "1":
            raise RuntimeError(f"COTSDL_NATIVE=1 but the native kernels are unavailable: {_failed}")
    return _lib


def kernel(name: str, dtype) -> Callable[..., None] | None:
    """``name`` for ``dtype`` as a callable taking arrays (by data pointer), ints and scalars; None if off."""
    if _override is False or (_override is None and mode() == "0"):
        return None
    dtype = np.dtype(dtype)
    fn = _kernels.get((name, dtype))
    if fn is not None:
        return fn
    lib = library()
    if lib is None or dtype not in _SUFFIX:
        return None
    suffix, scalar = _SUFFIX[dtype]
    cfn = getattr(lib, f"cotsdl_{name}_{suffix}")
    kinds = _signatures()[name]
    cfn.argtypes = [{"p": ctypes.c_void_p, "i": ctypes.c_long, "s": scalar}[k] for k in kinds]
    cfn.restype = None
    pointers = [i for i, k in enumerate(kinds) if k == "p"]

    def fn(*args):
        if len(args) != len(kinds):
            raise TypeError(f"{name}: {len(args)} arguments, expected {len(kinds)}")
        args = list(args)
        for i in pointers:
            if args[i] is not None:
                args[i] = args[i].ctypes.data
        cfn(*args)
    _kernels[(name, dtype)] = fn
    return fn


def strides(a: np.ndarray, inner: int) -> tuple[int, ...] | None:
    """The element strides of ``a``'s leading axes (all but the last ``inner``) when those last
    ``inner`` axes are C-contiguous, else None."""
    item, shape, st = a.itemsize, a.shape, a.strides
    expect = item
    for k in range(len(shape) - 1, len(shape) - 1 - inner, -1):
        if shape[k] > 1 and st[k] != expect:
            return None
        expect *= shape[k]
    lead = st[:len(shape) - inner]
    if any(s % item for s in lead):
        return None
    return tuple(s // item for s in lead)


def pixel_strides(a: np.ndarray) -> tuple[int, int] | None:
    """Element strides of a feature map's two spatial axes, when the rest (channels, images) is
    contiguous, else None."""
    return strides(a, a.ndim - 2)


def for_arrays(xp, name: str, *arrays: np.ndarray) -> Callable[..., None] | None:
    """The kernel ``name`` for element-wise passes over ``arrays`` (feature maps): None on a device
    (``xp`` not NumPy), when the kernels are off, or when one of the arrays is not laid out for it
    (:func:`pixel_strides`); the caller then runs its array-library path."""
    if xp is not np or any(pixel_strides(a) is None for a in arrays):
        return None
    return kernel(name, arrays[0].dtype)


@contextmanager
def use(on: bool | None) -> Iterator[None]:
    """Native kernels on (True), off (False) or as ``COTSDL_NATIVE`` says (None) inside the block."""
    global _override
    saved, _override = _override, on
    try:
        yield
    finally:
        _override = saved
