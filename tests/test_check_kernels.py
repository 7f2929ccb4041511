"""The NVRTC compile check (``cotsdl check-kernels``): real kernels, planted failures, the parser.

Tests that compile take the ``libs`` fixture, which *fails* (does not skip) when
no NVRTC is installed: the ``test`` extra installs ``nvidia-cuda-nvrtc-cu12``, so
a missing library is a broken environment, and a skipped compile check would
let spilling kernels through CI unnoticed.
"""
from __future__ import annotations

import json

import pytest

from cotsdl import backend
from cotsdl.tools import check_kernels, nvrtc

ARCHS = ["sm_70", "sm_80", "sm_90"]

# Written in normal CUDA style; __launch_bounds__(1024, 2) caps the kernel at
# 65536 / 2048 = 32 registers, far fewer than the 64 accumulators it keeps live.
SPILLER = r"""
extern "C" __global__ void __launch_bounds__(1024, 2)
spiller(float* out, const float* in, const int* idx, int n) {
    float acc[64];
#pragma unroll
    for (int k = 0; k < 64; ++k) acc[k] = in[k * n + threadIdx.x];
    float s = 0.f;
    for (int k = 0; k < n; ++k) {
#pragma unroll
        for (int j = 0; j < 64; ++j) acc[j] = acc[j] * in[idx[k] + j] + s;
        s += acc[k & 63];
    }
#pragma unroll
    for (int k = 0; k < 64; ++k) out[k * n + threadIdx.x] = acc[k] + s;
}
"""

# Captured from NVRTC 12.9 (sm_80: mangled kernels, a non-inlined device function
# reported after its caller) and NVRTC 13.5 (sm_100 with -maxrregcount=24: no
# cmem, "Overriding" lines before the first entry, a spilling kernel).
LOG_12 = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z4kernPdi' for 'sm_80'
ptxas info    : Function properties for _Z4kernPdi
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers, 364 bytes cmem[0]
ptxas info    : Compile time = 1.374 ms
ptxas info    : Compiling entry function '_Z4kernPfi' for 'sm_80'
ptxas info    : Function properties for _Z4kernPfi
ptxas         .     128 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 30 registers, used 1 barriers, 128 bytes cumulative stack size, 364 bytes cmem[0]
ptxas info    : Compile time = 3.078 ms
ptxas info    : Function properties for _Z3fooPKfi
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""
LOG_13 = """\
ptxas info    : Overriding maximum register limit 256 for 'spiller' with  24 of maxrregcount option
ptxas info    : Overriding maximum register limit 256 for '_Z4tsumILi256EEvPfPKf' with  24 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'spiller' for 'sm_100'
ptxas info    : Function properties for spiller
ptxas         .     832 bytes stack frame, 924 bytes spill stores, 1120 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 832 bytes cumulative stack size
ptxas info    : Compile time = 56.976 ms
ptxas info    : Compiling entry function '_Z4tsumILi256EEvPfPKf' for 'sm_100'
ptxas info    : Function properties for _Z4tsumILi256EEvPfPKf
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 14 registers, used 1 barriers, 1024 bytes smem
ptxas info    : Compile time = 2.308 ms
"""


@pytest.fixture(scope="module")
def libs():
    """The installed NVRTC libraries; a failure, not a skip, when there is none."""
    found = nvrtc.find_libraries()
    if not found:
        pytest.fail(f"no NVRTC library: {nvrtc.INSTALL_HINT}")
    return {major: nvrtc.NVRTC(path) for major, path in found.items()}


@pytest.fixture(scope="module")
def nv12(libs):
    """CUDA 12's NVRTC: the only one that still compiles for sm_70 (CUDA 13 dropped it)."""
    if 12 not in libs:
        pytest.fail(f"CUDA 12's NVRTC is needed for sm_70, found only CUDA {sorted(libs)}: "
                    "pip install nvidia-cuda-nvrtc-cu12")
    return libs[12]


def test_parser_on_captured_logs():
    recs = check_kernels.parse_ptxas_log(LOG_12, "sm_80")
    assert [(r["symbol"], r["entry"]) for r in recs] == [
        ("_Z4kernPdi", True), ("_Z4kernPfi", True), ("_Z3fooPKfi", False)]
    dbl, flt, foo = recs
    assert (dbl["registers"], dbl["smem"], dbl["stack"], dbl["cmem"], dbl["arch"]) == (8, 0, 0, 364, "sm_80")
    assert (flt["registers"], flt["barriers"], flt["stack"], flt["spill_stores"]) == (30, 1, 128, 0)
    assert foo["registers"] is None and foo["spill_loads"] == 0  # device functions get no "Used" line
    spill, tsum = check_kernels.parse_ptxas_log(LOG_13)  # arch read from the log
    assert spill == {"symbol": "spiller", "arch": "sm_100", "entry": True, "registers": 24, "smem": 0,
                     "cmem": None, "barriers": 0, "stack": 832, "spill_stores": 924, "spill_loads": 1120}
    assert (tsum["symbol"], tsum["registers"], tsum["smem"], tsum["spill_stores"]) == (
        "_Z4tsumILi256EEvPfPKf", 14, 1024, 0)


def test_nvrtc_library(nv12):
    assert nv12.version[0] == 12
    assert {70, 80, 90} <= set(nv12.supported_archs())


def test_user_options_reach_nvrtc(nv12, tmp_path):
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "v.cuh").write_text("#define FROM_HEADER 3\n")
    src = ('#include "v.cuh"\n#if !defined(NAME) || NAME != 7 || __cplusplus < 201703L\n#error options lost\n'
           '#endif\nextern "C" __global__ void k(int* x) { x[0] = NAME + FROM_HEADER; }\n')
    res = nv12.compile(src, "opts.cu", "sm_80", ["-DNAME=7", "-std=c++17", f"-I {tmp_path / 'inc'}"])
    assert res.cubin[:4] == b"\x7fELF"
    assert "Compiling entry function 'k' for 'sm_80'" in res.log


def test_real_kernels_compile_without_spills(nv12):
    lines = []
    res = check_kernels.run(archs=ARCHS, log=lines.append)
    assert res["ok"], "\n".join(lines)
    assert res["failures"] == []
    files = sorted(p.name for p in backend.cuda_dir().glob("*.cu"))
    for name in files:
        for arch in ARCHS:
            entries = [r for r in res["records"] if r["file"] == name and r["arch"] == arch and r["entry"]]
            assert entries, f"{name}: no kernel reported for {arch}"
            for r in entries:
                assert r["registers"] > 0 and r["spill_stores"] == 0 and r["spill_loads"] == 0, r
    halo = {r["kernel"] for r in res["records"] if r["file"] == "halo.cu"}
    assert {"pack_box_f32", "pack_box_f64", "unpack_box_f32", "unpack_box_f64"} <= halo  # extern "C" names
    assert lines[-1].startswith("check-kernels: OK")


def test_syntax_error_names_file_and_arch(nv12, tmp_path):
    bad = tmp_path / "broken.cu"
    bad.write_text('extern "C" __global__ void k(float* x) { x[0] = 1 }\n')
    with pytest.raises(nvrtc.CompileError) as err:
        nv12.compile(bad.read_text(), bad.name, "sm_80")
    assert "broken.cu" in str(err.value) and "sm_80" in str(err.value) and 'expected a ";"' in err.value.log
    lines = []
    res = check_kernels.run(archs=["sm_80", "sm_90"], sources=[bad], log=lines.append)
    assert not res["ok"]
    assert [f for f in res["failures"] if "broken.cu" in f and "sm_80" in f and "compile error" in f]
    assert [f for f in res["failures"] if "broken.cu" in f and "sm_90" in f]
    assert "FAILED" in "\n".join(lines)


def test_planted_spill_fails_the_verdict(libs, tmp_path, monkeypatch, capsys):
    (tmp_path / "spill.cu").write_text(SPILLER)
    res = check_kernels.run(archs=["sm_80"], sources=[tmp_path / "spill.cu"], log=lambda s: None)
    (rec,) = res["records"]
    assert (rec["kernel"], rec["arch"], rec["registers"]) == ("spiller", "sm_80", 32)
    assert rec["spill_stores"] > 0 and rec["spill_loads"] > 0
    assert not res["ok"]
    assert any("spill.cu" in f and "spiller" in f and "sm_80" in f and "spill" in f for f in res["failures"])
    # Through main: the same sources as the package's kernel folder give exit status 1.
    monkeypatch.setattr(backend, "cuda_dir", lambda: tmp_path)
    assert check_kernels.main(["--arch", "sm_80"]) == 1
    assert "spiller spills on sm_80" in capsys.readouterr().out


def test_main_writes_json(libs, tmp_path, capsys):
    path = tmp_path / "kernels.json"
    assert check_kernels.main(["--json", str(path), "--arch", "sm_80,90"]) == 0
    data = json.loads(path.read_text())
    assert data["ok"] is True and data["failures"] == [] and data["archs"] == ["sm_80", "sm_90"]
    assert {r["arch"] for r in data["records"]} == {"sm_80", "sm_90"}
    assert "--ptxas-options=-v" in data["options"]
    assert [p.name for p in tmp_path.iterdir()] == ["kernels.json"]  # no temporary file left
    assert "pack_box_f32" in capsys.readouterr().out


def test_main_usage_errors(tmp_path, capsys):
    assert check_kernels.main(["--arch", "compute_80"]) == 2
    assert check_kernels.main(["--json", str(tmp_path / "missing" / "x.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_missing_nvrtc_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setattr(nvrtc, "find_libraries", lambda: {})
    assert check_kernels.main([]) == 2
    assert "pip install nvidia-cuda-nvrtc-cu12" in capsys.readouterr().err
    monkeypatch.undo()  # the real find_libraries again, now with a wrong override
    monkeypatch.setenv(nvrtc.ENV_VAR, "/nonexistent/libnvrtc.so.12")
    with pytest.raises(nvrtc.NVRTCNotFound, match="COTSDL_NVRTC"):
        nvrtc.find_libraries()


def test_env_override_picks_the_library(nv12, monkeypatch):
    monkeypatch.setenv(nvrtc.ENV_VAR, str(nv12.path))
    assert nvrtc.find_libraries() == {12: nv12.path}


def test_an_unknown_architecture_is_not_an_install_problem():
    from cotsdl.cli import main

    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["check-kernels", "--arch", "sm_99"])
    assert rc != 0
    text = out.getvalue()
    assert "sm_99: not an architecture the installed NVRTC compiles for" in text and "pip install" not in text


def test_the_cuda_backend_without_cupy_names_the_extra():
    import importlib.util

    import pytest

    from cotsdl import backend

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here")
    with pytest.raises(ImportError, match=r"the cuda backend needs CuPy.*pip install 'cotsdl\[cuda12\]'"):
        backend.cupy_module()


def test_an_identical_compile_is_reused_and_an_edit_is_not(libs, tmp_path, monkeypatch):
    monkeypatch.setenv("COTSDL_KERNEL_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n')
    calls = []
    real = nvrtc.NVRTC.compile
    monkeypatch.setattr(nvrtc.NVRTC, "compile", lambda self, *a, **k: calls.append(a[2]) or real(self, *a, **k))
    first = check_kernels.run(archs=["sm_80"], sources=[src], log=lambda s: None)
    again = check_kernels.run(archs=["sm_80"], sources=[src], log=lambda s: None)
    assert calls == ["sm_80"] and first["records"] == again["records"] and again["ok"]
    (tmp_path / "inc.cuh").write_text("// a header beside the kernel is part of what it compiles\n")
    check_kernels.run(archs=["sm_80"], sources=[src], log=lambda s: None)
    check_kernels.run(archs=["sm_80"], sources=[src], log=lambda s: None, cache=False)
    assert calls == ["sm_80"] * 3


def test_every_tile_the_filter_wrapper_picks_is_a_checked_build():
    """Each set of #defines the filter wrapper can pass (every tile, dtype and GEMM variant) is one of
    filter.cu's builds that check-kernels compiles: an undeclared one would go unchecked for spills."""
    import numpy as np

    from cotsdl.ops.cuda import filter as cuda_filter

    defaults = {"TM": 64, "TN": 64, "RM": 4, "RN": 4, "TK": 16, "GT_STAGES": 1}  # gemm_tile.cuh's

    def norm(flags: dict) -> frozenset:
        return frozenset((k, int(v)) for k, v in flags.items() if defaults.get(k) != int(v))

    src = (backend.cuda_dir() / "filter.cu").read_text()
    builds = {norm(dict(f[2:].split("=") for f in v)) for v in check_kernels.variants(src)}
    picked = set()
    for gemm in cuda_filter.VARIANTS:
        for dtype in (np.float32, np.float64):
            for m in (1, 16, 17, 32, 33, 64, 65, 127, 128, 129, 972):
                for n in (1, 32, 33, 63, 64, 65, 96, 97, 128, 129, 192, 200):
                    picked.add(norm(cuda_filter._tiles(m, n, dtype, gemm)))
    assert picked <= builds, sorted(map(sorted, picked - builds))
    assert any(dict(b).get("GT_STAGES") == 4 for b in picked)  # the variants were reached
