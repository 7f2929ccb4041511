"""`cotsdl evaluate` on the GPU: the same report numbers as on the numpy backend.

A tiny run is trained on the device, then evaluated twice from the same checkpoint:
on the run's backend and with the config's backend switched to numpy.  Evaluation
must keep every array on the device (no host-only call on a CuPy array) and agree.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from cotsdl.io.dataset import write_dataset
from testkit import tiny_config

#: The device backend under test (the emulator, "cuda-emu", runs the same path on the CPU, slowly).
BACKEND = os.environ.get("COTSDL_GPU_TEST_BACKEND", "cuda")


def cotsdl(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "cotsdl", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(900)
def test_evaluate_on_the_device_matches_numpy(tmp_path):
    rng = np.random.default_rng(0)
    write_dataset(tmp_path / "tiny.h5", rng.integers(0, 256, (40, 12, 12), dtype=np.uint8))
    y = (np.arange(60) % 3 == 0).astype(np.int64)
    faces = rng.integers(0, 256, (60, 12, 12), dtype=np.uint8)
    faces[y == 1, 3:9, 3:9] = 255
    write_dataset(tmp_path / "faces.h5", faces, labels=y)
    cfg = tmp_path / "c.toml"
    cfg.write_text(tiny_config(tmp_path / "tiny.h5", tmp_path / "run", 3, 100).replace('backend = "numpy"',
                                                                                        f'backend = "{BACKEND}"'))
    trained = cotsdl("train", str(cfg))
    assert trained.returncode == 0, trained.stderr
    shutil.copytree(tmp_path / "run", tmp_path / "host")
    host_cfg = tmp_path / "host" / "config.toml"
    host_cfg.write_text(host_cfg.read_text().replace(f'backend = "{BACKEND}"', 'backend = "numpy"'))
    reports = {}
    for name in ("run", "host"):
        res = cotsdl("evaluate", str(tmp_path / name), "--dataset", str(tmp_path / "faces.h5"), "--splits", "4",
                     "--stimulus-steps", "3", "--no-figures")
        assert res.returncode == 0, res.stderr
        reports[name] = json.loads((tmp_path / name / "report.json").read_text())
    dev, host = reports["run"], reports["host"]
    assert dev["run"]["backend"] == BACKEND and host["run"]["backend"] == "numpy"
    for key in ("network", "random_weights", "best_pixel"):
        assert np.allclose(dev["scores"][key]["test_balanced_acc"], host["scores"][key]["test_balanced_acc"],
                           atol=0.02), key
    assert [s["cosine_to_init"] for s in dev["stages"]] == pytest.approx([s["cosine_to_init"] for s in host["stages"]],
                                                                         abs=1e-4)
