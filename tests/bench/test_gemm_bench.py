"""``cotsdl bench gemm`` on the emulator: every variant runs, agrees with the default, and is reported."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from cotsdl.bench import gemm
from cotsdl.ops.cuda import filter as cuda_filter


def test_every_variant_runs_and_agrees_on_the_emulator(tmp_path):
    out = tmp_path / "g.json"
    r = subprocess.run([sys.executable, "-m", "cotsdl", "bench", "gemm", "--backend", "cuda-emu", "--shapes",
                        "emu-tiny,emu-128", "--repeats", "1", "--min-time", "0", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert [row["shape"] for row in res["results"]] == ["emu-tiny", "emu-128"]
    tiny, big = res["results"]
    for row in res["results"]:
        assert set(row["passes"]) == set(gemm.PASSES)
        for p in row["passes"].values():
            assert set(p["variants"]) == set(cuda_filter.VARIANTS)
            assert all(v["agrees_with_default"] and v["seconds"] > 0 for v in p["variants"].values())
            assert p["fastest"] in cuda_filter.VARIANTS
    # on the small tiles every variant is the registers kernel; on the 128-row ones each its own
    assert all(v["same_kernel_as"] == "registers" for p in tiny["passes"].values()
               for k, v in p["variants"].items() if k != "registers")
    assert all(v["same_kernel_as"] is None and v["tile"].get("GT_STAGES", 1) == cuda_filter.VARIANTS[k]
               for p in big["passes"].values() for k, v in p["variants"].items())


def test_a_variant_that_does_not_exist_is_named(tmp_path):
    r = subprocess.run([sys.executable, "-m", "cotsdl", "bench", "gemm", "--backend", "cuda-emu", "--variants",
                        "registers,async7"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "no variant 'async7'" in r.stderr


def test_the_cuda_path_on_a_stand_in_device(monkeypatch):
    """``--backend cuda``'s own code on tests/devicestub.py's device arrays (kernels emulated): every
    variant checked on the device's arrays, timed, and set beside the model's prediction."""
    import io
    import sys as _sys

    from devicestub import device_backend

    monkeypatch.setattr(gemm, "device_ceilings", lambda: {
        "name": "stand-in", "compute_capability": "9.0", "fp32_peak_GFLOPs": 66.9e3, "memory_GBps": 4.8e3,
        "cublas_sgemm_GFLOPs": 51e3})
    monkeypatch.setattr(gemm, "_resources", lambda kern: (120, 29696))  # what CuPy's RawKernel reports
    log = io.StringIO()
    with device_backend(monkeypatch) as counts:
        cupy = _sys.modules["cupy"]
        monkeypatch.setattr(cupy.cuda.runtime, "deviceGetAttribute", lambda attr, dev: 132, raising=False)
        monkeypatch.setattr(cupy, "get_default_memory_pool",
                            lambda: type("Pool", (), {"free_all_blocks": lambda self: None})(), raising=False)
        res = gemm.run("cuda", [gemm.EMU_PIPELINE], repeats=1, min_time=0.0, log=log)
    assert counts["launches"] > 0
    (row,) = res["results"]
    for p in row["passes"].values():
        for v in p["variants"].values():
            assert v["agrees_with_default"] and v["blocks_per_sm"] == 2 and v["predicted_seconds"] > 0
            assert 0 < v["fraction_of_peak"] and v["predicted_over_measured"] > 0
    assert "fastest:" in log.getvalue() and res["device"]["sms"] == 132


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy imports here")
@pytest.mark.parametrize("bench", ["gemm", "layers"])
def test_without_cupy_the_cuda_benches_say_so_in_one_line(bench):
    r = subprocess.run([sys.executable, "-m", "cotsdl", "bench", bench, "--backend", "cuda"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "cotsdl: error: --backend cuda: the cuda backend needs CuPy" in r.stderr
