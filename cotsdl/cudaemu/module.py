"""The emulator's CuPy-like API: ``RawModule(...).get_function(name)(grid, block, args, shared_mem)``."""
from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from . import build, parse


def _dims(what: str, v: Any, kernel: str) -> tuple[int, int, int]:
    t = (v,) if isinstance(v, (int, np.integer)) else tuple(v)
    if not 1 <= len(t) <= 3 or any(not isinstance(x, (int, np.integer)) or x < 1 for x in t):
        raise ValueError(f"kernel {kernel}: {what} must be 1 to 3 positive integers, got {v!r}")
    return tuple(int(x) for x in t) + (1,) * (3 - len(t))  # type: ignore[return-value]


def asan_environment() -> dict[str, str]:
    """Environment for a process that loads AddressSanitizer builds (``asan=True``)."""
    lib = subprocess.run([build.compiler(), "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return {"LD_PRELOAD": lib, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:halt_on_error=1"}


class Function:
    """One kernel of a :class:`RawModule`, called like CuPy's ``RawKernel``."""

    def __init__(self, module: "RawModule", sig: parse.KernelSig):
        self.module, self.sig, self.name = module, sig, sig.name
        self._fn = getattr(module._lib, f"cotsdl_emu_launch__{sig.name}")
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]

    def _marshal(self, args: Sequence[Any]) -> tuple[list[np.ndarray], Any]:
        params = self.sig.params
        if len(args) != len(params):
            raise TypeError(f"kernel {self.name} takes {len(params)} arguments "
                            f"({', '.join(p.describe() for p in params)}), got {len(args)}")
        keep: list[np.ndarray] = []
        for i, (a, p) in enumerate(zip(args, params)):
            where = f"kernel {self.name}, argument {i} ({p.describe()})"
            if p.pointer:
                if not isinstance(a, np.ndarray):
                    raise TypeError(f"{where}: needs a NumPy array, got {type(a).__name__}")
                if not a.flags.c_contiguous:
                    raise ValueError(f"{where}: the array must be C-contiguous")
                if p.dtype is not None and a.dtype != p.dtype:
                    raise TypeError(f"{where}: needs dtype {p.dtype}, got {a.dtype}")
                if not p.const and not a.flags.writeable and a.size:
                    raise ValueError(f"{where}: the kernel may write through this pointer, the array is read-only")
                if a.ctypes.data % p.align:
                    raise ValueError(f"{where}: misaligned address (needs {p.align}-byte alignment)")
                keep.append(np.array(a.ctypes.data, dtype=np.uintp))
            else:
                if type(a) is not p.dtype.type:  # exact type: no silent int/float conversion
                    raise TypeError(f"{where}: needs numpy.{p.dtype.type.__name__}, got {type(a).__name__} {a!r}")
                keep.append(np.array(a, dtype=p.dtype))
        ptrs = (ctypes.c_void_p * max(1, len(keep)))(*[k.ctypes.data for k in keep])
        return keep, ptrs

    def __call__(self, grid, block, args: Sequence[Any], shared_mem: int = 0, *, order: str | None = None,
                 threads: int | None = None) -> None:
        g, b = _dims("grid", grid, self.name), _dims("block", block, self.name)
        order = order or os.environ.get("COTSDL_EMU_ORDER", "forward")
        if order not in ("forward", "reverse"):
            raise ValueError(f"thread order must be 'forward' or 'reverse', got {order!r} (COTSDL_EMU_ORDER)")
        copies = os.environ.get("COTSDL_EMU_ASYNC", "late")
        if copies not in ("late", "early"):
            raise ValueError(f"COTSDL_EMU_ASYNC must be 'late' or 'early', got {copies!r}")
        threads = threads or int(os.environ.get("COTSDL_EMU_THREADS", "1"))
        if int(shared_mem) < 0:
            raise ValueError(f"kernel {self.name}: shared_mem must be >= 0, got {shared_mem}")
        keep, ptrs = self._marshal(args)
        cfg = (ctypes.c_ulonglong * 9)(*g, *b, int(shared_mem),
                                           (order == "reverse") | (copies == "early") << 1, threads)
        if self._fn(cfg, ptrs) != 0:
            raise RuntimeError(f"cotsdl.cudaemu: {self.module._last_error()}")
        del keep


class RawModule:
    """A CUDA source compiled for the CPU emulator; the counterpart of ``cupy.RawModule``.

    Parameters
    ----------
    code : str, optional
        CUDA C source text.
    path : str or Path, optional
        A ``.cu`` file (instead of ``code``); its folder is on the include path.
    options : sequence of str
        NVRTC-style options: ``-DNAME=VALUE`` and ``-I dir`` apply; arch and std flags are ignored.
    asan : bool, optional
        Build with AddressSanitizer (default: ``COTSDL_EMU_ASAN=1``).  The process
        must be started with :func:`asan_environment`.
    """

    def __init__(self, code: str | None = None, path: str | os.PathLike | None = None, options: Sequence[str] = (),
                 *, asan: bool | None = None):
        if (code is None) == (path is None):
            raise ValueError("give exactly one of code= and path=")
        incl: list[str] = []
        if path is not None:
            path = Path(path)
            code, name = path.read_text(), str(path)
            incl.append(str(path.parent))
        else:
            name = "<code>"
        asan = os.environ.get("COTSDL_EMU_ASAN", "0") == "1" if asan is None else asan
        lib_path, self.kernels = build.build(code, name, tuple(options), asan, incl)
        try:
            self._lib = ctypes.CDLL(str(lib_path))
        except OSError as e:
            hint = " (an AddressSanitizer build: start the process with cotsdl.cudaemu.asan_environment())" if asan else ""
            raise RuntimeError(f"cannot load the emulator build of {name}: {e}{hint}") from e
        self._lib.cotsdl_emu_last_error.restype = ctypes.c_char_p
        self._functions: dict[str, Function] = {}

    def _last_error(self) -> str:
        return self._lib.cotsdl_emu_last_error().decode(errors="replace")

    def get_function(self, name: str) -> Function:
        if name not in self.kernels:
            raise KeyError(f"no extern \"C\" kernel {name!r}; the module has {sorted(self.kernels)}")
        if name not in self._functions:
            self._functions[name] = Function(self, self.kernels[name])
        return self._functions[name]
