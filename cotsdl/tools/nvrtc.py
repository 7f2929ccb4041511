"""A minimal ctypes binding of NVRTC, the CUDA run-time compiler: CUDA C++ to CUBIN.

NVRTC is a plain shared library (``libnvrtc.so.<major>``) shipped in pip wheels,
so kernels compile -- down to machine code for a chosen GPU, with the ptxas
resource report -- on a machine with no GPU, no driver and no CUDA toolkit.
This module finds the library, reports its version and architectures and
compiles a source string; :mod:`cotsdl.tools.check_kernels` builds the compile check
on it.  CuPy is not needed (it would want a driver to import its runtime).

Where the library is looked for, first hit per major version:

1. ``COTSDL_NVRTC=/path/to/libnvrtc.so.N`` (then nothing else is searched);
2. the files of the installed distributions ``nvidia-cuda-nvrtc-cu12``
   (``nvidia/cuda_nvrtc/lib/libnvrtc.so.12``) and ``nvidia-cuda-nvrtc``
   (CUDA 13: ``nvidia/cu13/lib/libnvrtc.so.13``), read from their metadata;
3. any ``*/lib/libnvrtc.so.N`` below the ``nvidia`` namespace package.
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import os
import re
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "COTSDL_NVRTC"
INSTALL_HINT = (
    "install NVRTC from pip: `pip install nvidia-cuda-nvrtc-cu12` (CUDA 12; sm_70 and up) "
    "or `pip install 'cotsdl[test]'` / `pip install 'cotsdl[cuda12]'`; add "
    "`nvidia-cuda-nvrtc` (CUDA 13) to also check sm_100; or point "
    f"{ENV_VAR} at a libnvrtc.so of a CUDA toolkit")

# The real library only: the wheels also hold libnvrtc.alt.so.12 and
# libnvrtc-builtins.so.12.9, which must not be taken for it.
_LIB_RE = re.compile(r"^libnvrtc\.so\.(\d+)$")
_SUCCESS = 0


class NVRTCNotFound(RuntimeError):
    """No NVRTC library could be found or loaded; the message says how to install one."""


class CompileError(RuntimeError):
    """NVRTC rejected a source for an architecture.

    Attributes
    ----------
    name, arch, log : str
        The source's file name, the target (``sm_XX``) and NVRTC's full log.
    """

    def __init__(self, name: str, arch: str, log: str, status: str = "") -> None:
        self.name, self.arch, self.log = name, arch, log
        super().__init__(f"{name}: compile error for {arch} ({status}):\n{log.rstrip()}")


@dataclass(frozen=True)
class CompileResult:
    """What a successful compile gives: the CUBIN image and NVRTC's log (ptxas report)."""

    cubin: bytes
    log: str


def _lib_major(path: Path) -> int | None:
    m = _LIB_RE.match(path.name)
    return int(m.group(1)) if m else None


def _candidates():
    """Paths that may be an NVRTC library, in order of preference."""
    # 1. The wheels' own file lists: exact, whatever folder layout a release uses
    #    (CUDA 12 wheels use nvidia/cuda_nvrtc/lib, CUDA 13 ones nvidia/cu13/lib).
    for dist in importlib.metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower().replace("_", "-")
        if not name.startswith("nvidia-cuda-nvrtc"):
            continue
        for f in dist.files or ():
            if _LIB_RE.match(Path(str(f)).name):
                yield Path(str(dist.locate_file(f)))
    # 2. Whatever else sits in the namespace package (a wheel without a RECORD).
    try:
        import nvidia  # noqa: PLC0415 - namespace package of the NVIDIA wheels

        roots = list(nvidia.__path__)
    except ImportError:
        roots = []
    for root in roots:
        yield from sorted(Path(root).glob("*/lib/libnvrtc.so.*"))


def find_libraries() -> dict[int, Path]:
    """The NVRTC libraries available, by CUDA major version (e.g. ``{12: path}``).

    Returns
    -------
    dict of int to Path
        Empty when none is installed.  With ``COTSDL_NVRTC`` set, only that one.

    Raises
    ------
    NVRTCNotFound
        ``COTSDL_NVRTC`` names a file that does not exist.
    """
    override = os.environ.get(ENV_VAR)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise NVRTCNotFound(f"{ENV_VAR}={override}: no such file")
        # A toolkit's libnvrtc.so is a symlink chain ending in libnvrtc.so.12.x.y;
        # the major is read from the library itself once it is loaded.
        return {NVRTC(path).version[0]: path}
    found: dict[int, Path] = {}
    for path in _candidates():
        major = _lib_major(path)
        if major is not None and major not in found and path.is_file():
            found[major] = path
    return found


class NVRTC:
    """One loaded NVRTC library.

    Parameters
    ----------
    path : str or Path
        The shared library (``libnvrtc.so.N``).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._lib = ctypes.CDLL(str(self.path))
        except OSError as e:
            raise NVRTCNotFound(f"cannot load {self.path}: {e}; {INSTALL_HINT}") from e
        self._lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self._lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version: tuple[int, int] = (major.value, minor.value)

    def _error(self, status: int) -> str:
        return self._lib.nvrtcGetErrorString(status).decode()

    def _check(self, status: int, what: str) -> None:
        if status != _SUCCESS:
            raise RuntimeError(f"{what} failed in {self.path}: {self._error(status)}")

    def supported_archs(self) -> list[int]:
        """The real architectures this NVRTC compiles for, e.g. ``[70, 75, 80, ...]``."""
        if not hasattr(self._lib, "nvrtcGetSupportedArchs"):  # before CUDA 11.2
            return []
        n = ctypes.c_int()
        self._check(self._lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)), "nvrtcGetNumSupportedArchs")
        archs = (ctypes.c_int * n.value)()
        self._check(self._lib.nvrtcGetSupportedArchs(archs), "nvrtcGetSupportedArchs")
        return list(archs)

    def compile(self, source: str, name: str, arch: str, options=()) -> CompileResult:
        """Compile ``source`` to CUBIN for one real architecture, with the ptxas report.

        Parameters
        ----------
        source : str
            CUDA C++ source text.
        name : str
            File name used in diagnostics (and for ``#line``-style messages).
        arch : str
            Real architecture, ``"sm_80"``; a virtual one (``compute_80``) would
            give PTX only, without a ptxas report, so it is refused.
        options : iterable of str
            Extra NVRTC options, one per string: ``-DNAME=VALUE``, ``-std=c++17``,
            ``-I dir``, ``-maxrregcount=32`` ...

        Returns
        -------
        CompileResult
            The CUBIN and the log: warnings plus, per entry function, ptxas'
            registers, shared memory, stack frame and spills.

        Raises
        ------
        CompileError
            NVRTC rejected the source or an option; the message names ``name``
            and ``arch`` and includes the log.
        """
        if not re.fullmatch(r"sm_\d+[af]?", arch):
            raise ValueError(f"{name}: arch must be a real architecture like sm_80, got {arch!r}")
        # --ptxas-options=-v: ptxas' verbose report (the same text nvcc -Xptxas -v
        # prints) ends up in the program log, for CUBIN output, on success too.
        opts = [f"--gpu-architecture={arch}", "--ptxas-options=-v", *options]
        prog = ctypes.c_void_p()
        self._check(self._lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(),
                                                 0, None, None), "nvrtcCreateProgram")
        try:
            argv = (ctypes.c_char_p * len(opts))(*(o.encode() for o in opts))
            status = self._lib.nvrtcCompileProgram(prog, len(opts), argv)
            log = self._log(prog)
            if status != _SUCCESS:
                raise CompileError(name, arch, log, self._error(status))
            size = ctypes.c_size_t()
            self._check(self._lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
            cubin = ctypes.create_string_buffer(size.value)
            self._check(self._lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
            return CompileResult(cubin.raw, log)
        finally:
            self._lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def _log(self, prog: ctypes.c_void_p) -> str:
        size = ctypes.c_size_t()
        self._check(self._lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
        buf = ctypes.create_string_buffer(size.value)
        self._check(self._lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        return buf.value.decode(errors="replace")
