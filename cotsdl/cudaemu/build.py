"""Compile a CUDA source for the emulator with g++ and cache the shared library.

The generated translation unit is: the shim (force-included), the kernel source
(with ``extern __shared__`` rewritten), the runtime, and one launcher per kernel.
Libraries are cached by the hash of everything that goes into them, and written
under a temporary name then renamed, so concurrent MPI ranks may build the same
module at once.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

from . import parse

HERE = Path(__file__).resolve().parent
# NVRTC options that mean nothing on the CPU and are accepted silently.
_IGNORED = ("-arch", "--gpu-architecture", "--use_fast_math", "-use_fast_math", "-lineinfo", "--generate-line-info",
            "-std", "--std", "--ptxas-options", "-Xptxas", "--device-as-default-execution-space", "-default-device")


def cache_dir() -> Path:
    """Where built modules live: ``COTSDL_EMU_CACHE``, else :func:`kernel_cache` ``("cudaemu")``."""
    env = os.environ.get("COTSDL_EMU_CACHE")
    return Path(env) if env else kernel_cache("cudaemu")


def kernel_cache(kind: str) -> Path:
    """The folder of built libraries of one kind: ``$COTSDL_KERNEL_CACHE/<kind>``, else
    ``$XDG_CACHE_HOME/cotsdl/<kind>`` (``~/.cache`` without XDG)."""
    if os.environ.get("COTSDL_KERNEL_CACHE"):
        return Path(os.environ["COTSDL_KERNEL_CACHE"]) / kind
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cotsdl" / kind


def compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise RuntimeError("cotsdl.cudaemu needs a C++17 compiler (g++): none found on PATH (set CXX)")
    return cxx


def translate_options(options: Sequence[str]) -> list[str]:
    """NVRTC-style options -> g++ flags (-D and -I pass through)."""
    out: list[str] = []
    it = iter(options)
    for opt in it:
        if opt in ("-D", "-I", "--define-macro", "--include-path"):
            val = next(it, None)
            if val is None:
                raise ValueError(f"option {opt} needs a value")
            out += [("-D" if opt in ("-D", "--define-macro") else "-I") + val]
        elif opt.startswith(("-D", "-I")):
            out.append(opt)
        elif opt.startswith("--define-macro="):
            out.append("-D" + opt.split("=", 1)[1])
        elif opt.startswith("--include-path="):
            out.append("-I" + opt.split("=", 1)[1])
        elif opt.split("=", 1)[0] in _IGNORED:
            continue
        else:
            raise ValueError(f"option {opt!r} is not understood by the emulator (use -D, -I, or NVRTC arch/std flags)")
    return out


def _run(cmd: list[str], what: str, cwd: Path) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if res.returncode != 0:
        msg = res.stderr.strip()
        if len(msg) > 6000:
            msg = msg[:6000] + "\n[...]"
        raise RuntimeError(f"{what} failed:\n{msg}")
    return res.stdout


def build(source: str, name: str, options: Sequence[str] = (), asan: bool = False,
          include_dirs: Sequence[str] = (), ucontext: bool | None = None) -> tuple[Path, dict[str, parse.KernelSig]]:
    """Build (or reuse) the emulator library of ``source``; return its path and kernels.

    ``ucontext`` selects the portable ucontext fibers instead of the x86-64 assembly
    switch (default: ``COTSDL_EMU_UCONTEXT=1``; always on with ``asan``).
    """
    if ucontext is None:
        ucontext = os.environ.get("COTSDL_EMU_UCONTEXT", "0") == "1"
    flags = translate_options(options) + [f"-I{d}" for d in include_dirs]
    if ucontext or asan:
        flags.append("-DCOTSDL_EMU_UCONTEXT")
    cxx = compiler()
    runtime = (HERE / "runtime.h").read_text()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    body = parse.rewrite_dynamic_shared(source)
    common = ["-std=c++17", "-include", str(HERE / "shim.h"), f"-I{HERE}", *flags]
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as tmp:
        t = Path(tmp)
        (t / "kernels.cu.cpp").write_text(f'#line 1 "{name}"\n{body}\n')
        pre = _run([cxx, "-E", "-P", "-x", "c++", *common, f"-D__global__={parse.MARKER}", "kernels.cu.cpp"],
                   f"preprocessing {name} for the emulator", t)
        # The key hashes the preprocessed source, so an edited #include rebuilds too.
        key = hashlib.sha256("\0".join([pre, name, *flags, str(asan), runtime, version]).encode()).hexdigest()[:24]
        lib, meta = folder / f"{key}.so", folder / f"{key}.json"
        if lib.exists() and meta.exists():
            sigs = json.loads(meta.read_text())
            return lib, {k: parse.kernels_from_json(v) for k, v in sigs.items()}
        sigs = parse.kernels(pre)
        if not sigs:
            raise RuntimeError(f"{name}: no extern \"C\" __global__ kernel found")
        launchers = "\n".join(f"COTSDL_EMU_LAUNCHER({k})" for k in sigs)
        (t / "module.cpp").write_text(f'#include "kernels.cu.cpp"\n#include "runtime.h"\n{launchers}\n')
        mode = ["-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer"] if asan else ["-O2"]
        # -z defs: an undefined symbol fails the build, not the load.
        _run([cxx, "-x", "c++", *common, *mode, "-fPIC", "-shared", "-fvisibility=hidden", "-pthread",
              "-Wl,-z,defs", "module.cpp", "-o", "module.so"], f"compiling {name} for the emulator", t)
        (t / "module.json").write_text(json.dumps({k: parse.kernel_to_json(v) for k, v in sigs.items()}))
        os.replace(t / "module.json", meta)
        os.replace(t / "module.so", lib)  # last: the library is the commit marker
    return lib, sigs
