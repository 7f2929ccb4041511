"""The wheel carries every module and the CUDA sources, and an installed copy finds them."""
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    # from a copy of the sources: two test workers building from the checkout at once would share its
    # build/ and *.egg-info folders and break each other
    src = tmp_path_factory.mktemp("src") / "cotsdl"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv*", "build", "*.egg-info", "runs", "*.h5",
                                                             "__pycache__", ".hypothesis"))
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(src)],
                   check=True, capture_output=True, text=True, timeout=300)
    (whl,) = out.glob("cotsdl-*.whl")
    return whl


@pytest.mark.timeout(300)
def test_wheel_contains_kernels_and_every_module(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    kernels = sorted(p.name for p in (ROOT / "cuda").iterdir() if p.suffix in (".cu", ".cuh"))
    assert kernels, "no kernel sources in cuda/"
    for k in kernels:
        assert f"cotsdl/cuda/{k}" in names
    for h in ("shim.h", "runtime.h"):  # the emulator compiles kernels with these
        assert f"cotsdl/cudaemu/{h}" in names
    for src in ("kernels.cpp", "filter.cpp"):  # the numpy backend's native kernels, built on first use
        assert f"cotsdl/ops/cpu/native/{src}" in names
    modules = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "cotsdl").rglob("*.py"))
    missing = [m for m in modules if m not in names]
    assert not missing, f"modules missing from the wheel (list their package in setup.cfg): {missing}"
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "cotsdl = cotsdl.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


@pytest.mark.timeout(300)
def test_installed_wheel_finds_its_kernels(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target",
                    str(target), str(wheel)], check=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = ("import cotsdl, cotsdl.backend as b; d = b.cuda_dir(); "
            "print(cotsdl.__file__); print(d); print(sorted(p.name for p in d.glob('*.cu')))")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    mod_file, cuda, kernels = res.stdout.splitlines()
    assert mod_file.startswith(str(target)), "the installed copy, not the checkout, must be imported"
    assert cuda == str(target / "cotsdl" / "cuda")
    assert "halo.cu" in kernels


def test_checkout_finds_its_kernels():
    from cotsdl.backend import cuda_dir

    assert (cuda_dir() / "halo.cu").is_file()
