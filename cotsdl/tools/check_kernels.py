"""``cotsdl check-kernels``: compile every kernel with NVRTC and fail on errors or spills.

Each ``*.cu`` file of :func:`cotsdl.backend.cuda_dir` is compiled to CUBIN for
sm_70, sm_80 and sm_90 by CUDA 12's NVRTC, and for sm_100 when a CUDA 13 NVRTC
is installed too (CUDA 13 dropped sm_70, so the two are complementary).  ptxas'
verbose report gives, per kernel and architecture, registers, static shared
memory, stack frame and spill stores/loads.  No GPU or driver is needed.

The verdict fails on any compile error and on any spill: a spill is local-memory
traffic in the inner loop that the performance model (DESIGN.md section 6) does
not account for, so it is treated as a bug of the kernel, not a tuning detail.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterable

from .. import __version__
from ..cudaemu.build import kernel_cache
from . import nvrtc

DEFAULT_ARCHS = ("sm_70", "sm_80", "sm_90")  # V100, A100, H100: what must always pass
NEW_ARCHS = ("sm_100",)  # checked when a CUDA 13 NVRTC is installed
BASE_OPTIONS = ("-std=c++17",)

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_FIELDS = {"smem": re.compile(r"(\d+) bytes smem"), "cmem": re.compile(r"(\d+) bytes cmem\[0\]"),
           "barriers": re.compile(r"used (\d+) barriers")}


def parse_ptxas_log(log: str, arch: str | None = None) -> list[dict]:
    """Per-function resource records from a ptxas ``-v`` report.

    Parameters
    ----------
    log : str
        NVRTC's program log of a compile with ``--ptxas-options=-v``.
    arch : str, optional
        The target, for functions the log does not name one for (non-inlined
        device functions are reported without "Compiling entry function").

    Returns
    -------
    list of dict
        One per function in log order: ``symbol`` (as in the CUBIN: the plain
        name of an ``extern "C"`` kernel, else the mangled one), ``arch``,
        ``entry`` (a ``__global__`` kernel), ``registers``, ``smem`` (static
        shared bytes; dynamic shared memory is set at launch and not included),
        ``cmem``, ``barriers``, ``stack``, ``spill_stores``, ``spill_loads``.
        Fields the log does not give are None (ptxas gives no registers for
        device functions, and CUDA 13 prints no cmem).
    """
    records: dict[tuple[str, str], dict] = {}
    entry = props = None

    def record(name: str, is_entry: bool) -> dict:
        key = (name, arch or "")
        if key not in records:
            records[key] = {"symbol": name, "arch": arch, "entry": is_entry, "registers": None,
                            "smem": 0, "cmem": None, "barriers": None, "stack": None,
                            "spill_stores": None, "spill_loads": None}
        return records[key]

    for line in log.splitlines():
        if m := _ENTRY.search(line):
            arch = m.group(2)
            entry = props = record(m.group(1), True)
        elif m := _PROPS.search(line):
            props = record(m.group(1), entry is not None and m.group(1) == entry["symbol"])
        elif (m := _FRAME.search(line)) and props is not None:
            props["stack"], props["spill_stores"], props["spill_loads"] = map(int, m.groups())
        elif (m := _USED.search(line)) and entry is not None:
            # "Used ..." always closes the entry function being compiled, even when
            # properties of a callee were printed in between.
            entry["registers"] = int(m.group(1))
            for field, rx in _FIELDS.items():
                if f := rx.search(line):
                    entry[field] = int(f.group(1))
    return list(records.values())


def _demangle(symbols: Iterable[str]) -> dict[str, str]:
    """Readable names of mangled C++ symbols, through c++filt when it is installed."""
    mangled = sorted({s for s in symbols if s.startswith("_Z")})
    tool = shutil.which("c++filt")
    if not mangled or tool is None:
        return {}
    out = subprocess.run([tool], input="\n".join(mangled), capture_output=True, text=True, check=False)
    names = out.stdout.splitlines()
    return dict(zip(mangled, names)) if out.returncode == 0 and len(names) == len(mangled) else {}


def _normalize_arch(text: str) -> str:
    arch = text.strip().lower()
    arch = arch if arch.startswith("sm_") else f"sm_{arch}"
    if not re.fullmatch(r"sm_\d+[af]?", arch):
        raise ValueError(f"--arch {text!r}: expected a real architecture such as sm_80")
    return arch


def _arch_number(arch: str) -> int:
    return int(re.match(r"sm_(\d+)", arch).group(1))


def _compiler_for(arch: str, libs: dict[int, nvrtc.NVRTC]) -> nvrtc.NVRTC | None:
    """The NVRTC that checks ``arch``: CUDA 12's up to sm_90, CUDA 13's from sm_100.

    That is the compiler CuPy would use on such a GPU with the matching
    ``cupy-cuda12x``/``cupy-cuda13x``; any other installed one that supports
    the arch is the fallback.
    """
    preferred = 12 if _arch_number(arch) < 100 else 13
    for major in sorted(libs, key=lambda m: (m != preferred, m)):
        supported = libs[major].supported_archs()
        if not supported or _arch_number(arch) in supported:
            return libs[major]
    return None


def variants(source: str) -> list[list[str]]:
    """The default build plus every ``// check-kernels variant: -DNAME=VALUE ...`` line of a source.

    Wrappers compile some kernels with other ``#define`` values (tile sizes); each such
    set is declared in the file so that it is checked too.
    """
    out: list[list[str]] = [[]]
    for line in source.splitlines():
        m = re.match(r"\s*//\s*check-kernels variant:\s*(.+)$", line)
        if m:
            out.append(m.group(1).split())
    return out


def format_table(records: list[dict]) -> str:
    """The printed table: file, kernel, arch, NVRTC, regs, smem, stack, spill st/ld."""
    head = ("file", "kernel", "arch", "nvrtc", "regs", "smem", "stack", "spill st/ld")
    rows = [head] + [(r["file"], r["kernel"], r["arch"], r["nvrtc"],
                      "-" if r["registers"] is None else str(r["registers"]), str(r["smem"]),
                      str(r["stack"]), f"{r['spill_stores']}/{r['spill_loads']}") for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    left = 4  # text columns left-aligned, numbers right-aligned
    return "\n".join("  ".join(c.ljust(w) if i < left else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths))) for row in rows)


def cache_dir() -> Path:
    """Where compile results are kept: ``$COTSDL_KERNEL_CACHE/nvrtc``, else ``$XDG_CACHE_HOME/cotsdl/nvrtc``."""
    return kernel_cache("nvrtc")


def _compile(nv: nvrtc.NVRTC, text: str, src: Path, arch: str, opts: list[str], cache: bool) -> nvrtc.CompileResult:
    """``nv.compile``, remembered by the hash of everything that goes into it (the source, the
    headers beside it, arch, options, the library): a test session compiles each kernel once."""
    if not cache:
        return nv.compile(text, src.name, arch, opts)
    h = hashlib.sha256()
    for part in (text, src.name, arch, json.dumps(opts), str(nv.path), "%d.%d" % nv.version):
        h.update(part.encode() + b"\0")
    for header in sorted(src.parent.glob("*.cuh")):
        h.update(header.name.encode() + b"\0" + header.read_bytes() + b"\0")
    path = cache_dir() / f"{h.hexdigest()}.json"
    try:
        saved = json.loads(path.read_text())
        return nvrtc.CompileResult(base64.b64decode(saved["cubin"]), saved["log"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not compiled yet, or an unreadable entry: compile (errors are never cached)
    result = nv.compile(text, src.name, arch, opts)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"log": result.log, "cubin": base64.b64encode(result.cubin).decode()}))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only or full cache only costs the next compile
    return result


def run(json_path: str | None = None, archs: Iterable[str] | None = None,
        log: Callable[[str], None] = print, sources: Iterable[str | Path] | None = None,
        options: Iterable[str] = (), cache: bool = True) -> dict:
    """Compile every kernel source for every architecture and give the verdict.

    Parameters
    ----------
    json_path : str, optional
        Write the result there as JSON, atomically (also when the check fails).
    archs : iterable of str, optional
        ``sm_XX`` targets; default sm_70, sm_80, sm_90, plus sm_100 when a
        CUDA 13 NVRTC is installed.
    log : callable
        Receives the printed lines (table, NVRTC warnings, verdict).
    sources : iterable of path, optional
        ``.cu`` files to check instead of those of ``cotsdl.backend.cuda_dir()``.
    options : iterable of str
        Extra NVRTC options for every compile (``-DNAME=VALUE``, ``-maxrregcount=N``).
    cache : bool
        Reuse the result of an identical earlier compile (:func:`cache_dir`).

    Returns
    -------
    dict
        ``ok``, ``failures`` (messages naming file, kernel and arch),
        ``records`` (one per function, file and arch), ``warnings``, the
        ``nvrtc`` libraries and the exact ``options`` used.

    Raises
    ------
    cotsdl.nvrtc.NVRTCNotFound
        No NVRTC library is installed; the message says how to install one.
    """
    found = nvrtc.find_libraries()
    if not found:
        raise nvrtc.NVRTCNotFound(f"no NVRTC library found; {nvrtc.INSTALL_HINT}")
    libs = {major: nvrtc.NVRTC(path) for major, path in found.items()}
    if archs is None:
        archs = DEFAULT_ARCHS + (NEW_ARCHS if max(libs) >= 13 else ())
    archs = sorted({_normalize_arch(a) for a in archs}, key=_arch_number)
    if sources is None:
        from ..backend import cuda_dir  # noqa: PLC0415 - numpy import only when needed

        sources = sorted(cuda_dir().glob("*.cu"))
    sources = [Path(s) for s in sources]

    records, failures, warnings = [], [], []
    for arch in archs:
        nv = _compiler_for(arch, libs)
        if nv is None:
            known = sorted({a for lib in libs.values() for a in lib.supported_archs()})
            have = ", ".join(f"CUDA {m}" for m in sorted(libs))
            if _arch_number(arch) > max(known):  # perhaps a newer CUDA knows it
                failures.append(f"{arch}: newer than every installed NVRTC knows ({have}: up to sm_{max(known)}); "
                                "a newer CUDA's NVRTC may compile it (CUDA 13: pip install nvidia-cuda-nvrtc)")
            else:  # NVRTC is installed: the architecture itself is the problem
                failures.append(f"{arch}: not an architecture the installed NVRTC compiles for ({have} knows "
                                f"{', '.join(f'sm_{a}' for a in known)})")
            continue
        version = "%d.%d" % nv.version
        for src in sources:
            text = src.read_text()
            for variant in variants(text):
                label = src.name if not variant else f"{src.name} [{' '.join(variant)}]"
                # -I the file's folder: a kernel may #include a shared .cuh next to it.
                opts = [*BASE_OPTIONS, f"--include-path={src.parent.resolve()}", *options, *variant]
                try:
                    result = _compile(nv, text, src, arch, opts, cache)
                except nvrtc.CompileError as e:
                    log(str(e))
                    first = next((ln for ln in e.log.splitlines() if "error" in ln), "see the log above")
                    failures.append(f"{label}: compile error for {arch} (NVRTC {version}): {first.strip()}")
                    continue
                for line in result.log.splitlines():
                    if line.strip() and not line.startswith("ptxas") and line not in [w["text"] for w in warnings]:
                        warnings.append({"file": label, "arch": arch, "text": line})
                for rec in parse_ptxas_log(result.log, arch):
                    records.append({"file": label, "kernel": rec["symbol"], **rec, "nvrtc": version})
    records.sort(key=lambda r: (r["file"], _arch_number(r["arch"]), not r["entry"], r["symbol"]))
    names = _demangle(r["symbol"] for r in records)
    for r in records:
        r["kernel"] = names.get(r["symbol"], r["symbol"])
        if r["spill_stores"] is None:
            failures.append(f"{r['file']}: kernel {r['kernel']} on {r['arch']}: ptxas gave no spill report")
        elif r["spill_stores"] or r["spill_loads"]:
            failures.append(f"{r['file']}: kernel {r['kernel']} spills on {r['arch']} (NVRTC {r['nvrtc']}): "
                            f"{r['spill_stores']} bytes spill stores, {r['spill_loads']} bytes spill loads")
    if not sources:
        failures.append("no kernel sources (*.cu) to check")

    if records:
        log(format_table(records))
    for w in warnings:
        log(f"{w['file']} {w['arch']}: {w['text']}")
    kernels = len({(r["file"], r["symbol"]) for r in records if r["entry"]})
    if failures:
        log(f"check-kernels: FAILED ({len(failures)} problem(s)):")
        for f in failures:
            log(f"  {f}")
    else:
        log(f"check-kernels: OK: {kernels} kernel(s) in {len(sources)} file(s) compiled for "
            f"{', '.join(archs)} with no spills")
    result = {"cotsdl": __version__, "ok": not failures, "failures": failures, "archs": archs,
              "nvrtc": [{"major": m, "version": "%d.%d" % nv.version, "path": str(nv.path)}
                        for m, nv in sorted(libs.items())],
              "options": ["--gpu-architecture=<arch>", "--ptxas-options=-v", *BASE_OPTIONS,
                          "--include-path=<folder of the file>", *options],
              "sources": [str(s) for s in sources], "records": records, "warnings": warnings}
    if json_path is not None:
        from ..bench.common import write_json  # noqa: PLC0415

        write_json(json_path, result)
    return result


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cotsdl check-kernels", description=__doc__.splitlines()[0])
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the options of ``check-kernels`` to ``p`` (for the ``cotsdl`` subcommand)."""
    p.add_argument("--json", metavar="FILE", help="write per-kernel records and the verdict as JSON")
    p.add_argument("--arch", action="append", metavar="SM",
                   help="target(s), e.g. sm_80 or 80,90; repeatable (default: sm_70 sm_80 sm_90, "
                        "and sm_100 when a CUDA 13 NVRTC is installed)")
    p.add_argument("--no-cache", action="store_true",
                   help="compile everything anew (default: reuse identical earlier compiles, see COTSDL_KERNEL_CACHE)")


def main(argv: list[str] | None = None) -> int:
    """Run the check from the command line.

    Returns
    -------
    int
        0 when every kernel compiled without spills, 1 on a compile error,
        spill or unsupported architecture, 2 on a usage or installation
        problem (no NVRTC, bad ``--arch``, unwritable ``--json`` folder).
    """
    args = _parser().parse_args(argv)
    return run_args(args)


def run_args(args: argparse.Namespace) -> int:
    """:func:`main` on parsed arguments (``args.json``, ``args.arch``)."""
    from ..bench.common import check_output_path  # noqa: PLC0415

    try:
        archs = None if not args.arch else [_normalize_arch(a) for s in args.arch for a in s.split(",") if a]
        problem = check_output_path(args.json)
        if problem:
            raise ValueError(problem)
        result = run(args.json, archs, cache=not getattr(args, "no_cache", False))
    except (ValueError, nvrtc.NVRTCNotFound) as e:
        print(f"cotsdl check-kernels: {e}", file=sys.stderr)
        return 2
    return 0 if result["ok"] else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
