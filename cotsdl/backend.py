"""Array backends: numpy | cuda | cuda-emu; kernel loading and the one launch interface.

The only module that decides the array library and touches CuPy, and only lazily,
so the package imports on a machine without it.  The backend is chosen once per
process: by :func:`use` (the command line's ``--backend`` and ``run.backend``; tests
use :func:`using`), else on first use from ``COTSDL_BACKEND=numpy|cuda|cuda-emu``,
else ``cuda`` when a CUDA device exists, else ``numpy``.  ``cuda-emu`` runs the CUDA
backend's wrapper code and the ``.cu`` kernels through :mod:`cotsdl.cudaemu` on
NumPy arrays (slow; for tests and kernel authors).  :func:`xp` is the array library
new arrays are made with; :func:`array_module` the library of an existing array.
Kernels are launched through :func:`launch` whatever runs them.
"""
from __future__ import annotations

import ctypes
import os
import re
from contextlib import contextmanager
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

BACKENDS = ("numpy", "cuda", "cuda-emu")
_chosen: str | None = None  # the process's backend, fixed on first use


def is_device_array(arr: Any) -> bool:
    """True for arrays in GPU memory (anything exposing ``__cuda_array_interface__``)."""
    return hasattr(arr, "__cuda_array_interface__")


def array_module(arr: Any):
    """``numpy`` or ``cupy``, whichever ``arr`` belongs to (``numpy`` for None)."""
    if is_device_array(arr):
        import cupy  # noqa: PLC0415 - only when a device array exists

        return cupy
    return np


def to_numpy(arr: Any) -> np.ndarray:
    """A host copy (or the array itself, if it is already on the host)."""
    return arr.get() if is_device_array(arr) else np.asarray(arr)


def synchronize(arr: Any) -> None:
    """Wait for pending device work on the current stream (no-op for host arrays).

    Must precede handing a device buffer to MPI: MPI does not see CUDA streams.
    """
    if is_device_array(arr):
        import cupy  # noqa: PLC0415

        cupy.cuda.get_current_stream().synchronize()


def empty_host_like(arr: Any) -> np.ndarray:
    """A host buffer for staging ``arr``: page-locked when ``arr`` is on a device."""
    if is_device_array(arr):
        import cupyx  # noqa: PLC0415

        return cupyx.empty_pinned(arr.shape, arr.dtype)
    return np.empty(arr.shape, arr.dtype)


def copy_to_host(src: Any, dst: np.ndarray) -> None:
    """Copy a (device or host) array into host array ``dst`` and wait for it."""
    if is_device_array(src):
        src.get(out=dst)
        synchronize(src)
    else:
        np.copyto(dst, src)


def copy_from_host(src: np.ndarray, dst: Any) -> None:
    """Copy host array ``src`` into (device or host) array ``dst``.

    For a device array the copy is queued on the current stream (it may still be
    running on return); the exchange synchronizes before MPI touches ``src`` again.
    """
    if is_device_array(dst):
        dst.set(src)
    else:
        np.copyto(dst, src)


def constant(a: np.ndarray, like: Any, key: Any = None) -> Any:
    """Read-only host array ``a`` for use beside ``like``: ``a`` itself beside host arrays; beside
    device arrays a copy on the current device, made once and kept (a copy per call would be a
    synchronous host-to-device transfer).  Kept per ``key`` (hashable: whatever determines ``a``,
    which spares hashing a large array's bytes on every call), else per contents; and per dtype,
    shape, device and array module.  Nothing may write the result."""
    if not is_device_array(like):
        return a
    a, cupy = np.ascontiguousarray(a), cupy_module()
    # the module too: a stand-in CuPy's arrays (tests) never reach the real one's kernels
    k = (a.tobytes() if key is None else ("key", key), a.dtype.str, a.shape, cupy.cuda.Device().id, cupy)
    kept = _CONSTANTS.pop(k, None)
    if kept is None:
        kept = cupy.asarray(a)
        if len(_CONSTANTS) >= _CONSTANTS_KEPT:
            del _CONSTANTS[next(iter(_CONSTANTS))]  # the least recently used
    _CONSTANTS[k] = kept
    return kept


_CONSTANTS: dict = {}  # insertion order = use order (constant() re-inserts on every use)
_CONSTANTS_KEPT = 256


def kept_constants() -> list:
    """The device copies :func:`constant` keeps now (whoever holds device addresses of them, such as a
    captured CUDA graph, keeps these references: the cache may drop its own)."""
    return list(_CONSTANTS.values())


def cuda_dir() -> Path:
    """The folder of the ``.cu``/``.cuh`` kernel sources.

    In an installed wheel it is the package data ``cotsdl/cuda``; in a source
    checkout (or editable install) it is the top-level ``cuda/`` folder.
    """
    try:
        installed = Path(str(resources.files("cotsdl") / "cuda"))
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - odd loaders
        installed = Path(__file__).parent / "cuda"
    for candidate in (installed, Path(__file__).resolve().parent.parent / "cuda"):
        if candidate.is_dir() and any(candidate.glob("*.cu")):
            return candidate
    raise FileNotFoundError(
        f"cotsdl kernel sources not found: looked in {installed} and "
        f"{Path(__file__).resolve().parent.parent / 'cuda'}; reinstall the package")


@lru_cache(maxsize=None)
def device_count() -> int:
    """CUDA devices visible to this process, asked of the driver (libcuda), not of CuPy.

    A machine with a GPU but a broken CuPy must not look like a machine without one.
    """
    for lib_name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(lib_name)
        except OSError:
            continue
        if lib.cuInit(0) != 0:
            return 0
        n = ctypes.c_int(0)
        return n.value if lib.cuDeviceGetCount(ctypes.byref(n)) == 0 else 0
    return 0


def _check(choice: str) -> str:
    if choice not in BACKENDS:
        raise ValueError(f"the backend must be one of {', '.join(BACKENDS)}, got {choice!r}")
    return choice


def use(choice: str) -> None:
    """Choose this process's backend (``numpy``, ``cuda`` or ``cuda-emu``), before or instead of
    ``COTSDL_BACKEND``.  Call it before making arrays: arrays already made keep their library."""
    global _chosen
    _chosen = _check(choice)


@contextmanager
def using(choice: str | None) -> Iterator[str]:
    """Run a block on backend ``choice`` (None: the current one) and restore the previous choice."""
    global _chosen
    before = _chosen
    try:
        if choice is not None:
            use(choice)
        yield name()
    finally:
        _chosen = before


def name() -> str:
    """The backend in use: :func:`use`'s choice, else ``COTSDL_BACKEND``, else ``cuda`` with a
    device, else ``numpy``; read once, then fixed for the process."""
    global _chosen
    if _chosen is None:
        env = os.environ.get("COTSDL_BACKEND", "").strip()
        if env and env not in BACKENDS:
            raise ValueError(f"COTSDL_BACKEND must be one of {', '.join(BACKENDS)}, got {env!r}")
        _chosen = env or ("cuda" if device_count() > 0 else "numpy")
    return _chosen


def xp():
    """The array library of the backend: CuPy for ``cuda``, NumPy for ``numpy`` and ``cuda-emu``."""
    return cupy_module() if name() == "cuda" else np


def uses_kernels(arr: Any) -> bool:
    """True when work on ``arr`` goes through the CUDA kernels (on a GPU or emulated)."""
    return is_device_array(arr) or name() == "cuda-emu"


def _preamble(defines: Mapping[str, Any]) -> str:
    return "".join(f"#define {k} {v}\n" for k, v in sorted(defines.items()))


def _inline_includes(folder: Path, file: str, seen: set[str]) -> str:
    """The source of ``file`` with its local ``#include "x.cuh"`` files pasted in.

    CuPy's kernel cache is keyed by the source string, not by included files: with the
    headers inlined, editing one recompiles instead of reusing a stale binary.
    """
    if file in seen:
        return ""
    seen.add(file)
    out = [f'#line 1 "{file}"']
    for n, line in enumerate((folder / file).read_text().splitlines(), start=1):
        m = re.match(r'\s*#\s*include\s*"([^"]+)"', line)
        if m and (folder / m.group(1)).is_file():
            out.append(_inline_includes(folder, m.group(1), seen))
            out.append(f'#line {n + 1} "{file}"')
        else:
            out.append(line)
    return "\n".join(out) + "\n"


@lru_cache(maxsize=None)
def _module(kind: str, device: int, file: str, defines: tuple[tuple[str, Any], ...]):
    # COTSDL_KERNEL_CACHE puts compiled kernels somewhere node-local (clusters' home
    # file systems are slow and shared); CuPy reads CUPY_CACHE_DIR.
    cache = os.environ.get("COTSDL_KERNEL_CACHE")
    if cache:
        os.environ.setdefault("CUPY_CACHE_DIR", os.path.join(cache, "cupy"))
    folder = cuda_dir()
    code = _preamble(dict(defines)) + _inline_includes(folder, file, set())
    if kind == "cuda-emu":
        from . import cudaemu  # noqa: PLC0415

        return cudaemu.RawModule(code=code, options=(f"-I{folder}",))
    return cupy_module().RawModule(code=code, options=("-std=c++17", f"-I{folder}"))


def kernel(file: str, fn: str, defines: Mapping[str, Any] | None = None, device_array: bool = True):
    """Kernel ``fn`` of ``cuda/<file>`` (with ``#define`` preamble ``defines``), memoized per device.

    ``device_array`` says whether the data lives on a GPU (CuPy) or is emulated.
    """
    if device_array:
        kind, dev = "cuda", cupy_module().cuda.Device().id
    else:
        kind, dev = "cuda-emu", -1
    return _module(kind, dev, file, tuple(sorted((defines or {}).items()))).get_function(fn)


def launch(kern: Any, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...], shared_mem: int = 0) -> None:
    """The one launch interface: a CuPy ``RawKernel`` or an emulator ``Function``, same call."""
    kern(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem)


def set_device(index: int) -> None:
    """Make GPU ``index`` current (no-op without the cuda backend)."""
    if name() == "cuda":
        cupy_module().cuda.Device(index % max(1, device_count())).use()


def cupy_module():
    """CuPy, or an ImportError that says which extra installs it (the cuda backend needs it)."""
    try:
        import cupy  # noqa: PLC0415
    except ImportError as e:
        raise ImportError(f"the cuda backend needs CuPy, which does not import ({e}): pip install 'cotsdl[cuda12]' "
                          "(or 'cotsdl[cuda13]'), or choose the numpy backend (run.backend = \"numpy\", "
                          "--backend numpy or COTSDL_BACKEND=numpy)") from None
    return cupy
