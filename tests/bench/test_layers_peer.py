"""``cotsdl bench layers --peer``: runs with or without PyTorch/JAX, checks agreement before timing."""
from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest

from cotsdl import backend
from cotsdl.bench import layers, peers

PASSES = {"filter_forward", "filter_bwd_data", "filter_bwd_weights", "pool_forward", "pool_backward",
          "lcn_forward", "lcn_backward", "train_step"}
FILTER = {"filter_forward", "filter_bwd_data", "filter_bwd_weights"}
#: torch-funfold's passes: its backward-data would be torch's own fold
FUNFOLD = {"filter_forward", "filter_bwd_weights", "train_step"}


@pytest.mark.timeout(900)
def test_peer_on_a_small_shape_agrees_or_reports():
    log = io.StringIO()
    res = layers.run(repeats=1, min_time=0.0, peer=True, log=log, shapes=[layers.TINY])
    have = layers.peers_importable()
    assert res["peers"] == have
    (row,) = res["results"]
    assert set(row["ops"]) == PASSES
    if not have:
        assert "neither PyTorch nor JAX is importable" in log.getvalue()
        return
    for name, rec in row["ops"].items():
        for peer, pr in rec["peers"].items():
            assert peer in have
            # Every formulation computes our function on this shape; each is timed with a ratio.
            assert pr["agrees"], (name, peer, pr)
            assert pr["seconds"] > 0 and pr["ratio"] > 0
        best = min(rec["peers"].items(), key=lambda kv: kv[1]["seconds"])
        assert rec["best_peer"]["peer"] == best[0] and rec["best_peer"]["ratio"] == best[1]["ratio"]
    torch_passes = {n for n, r in row["ops"].items() if "torch" in r["peers"]}
    assert torch_passes == (PASSES if "torch" in have else set())
    funfold_passes = {n for n, r in row["ops"].items() if "torch-funfold" in r["peers"]}
    assert funfold_passes == (FUNFOLD if "torch" in have else set())
    jax_passes = {n for n, r in row["ops"].items() if "jax" in r["peers"]}
    assert jax_passes == ({"filter_forward", "filter_bwd_data", "filter_bwd_weights"} if "jax" in have else set())
    assert res["peer_devices"] == {p: "cpu" for p in have}


def test_agreement_check_rejects_a_different_function():
    a = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
    assert layers._agree(a + 1e-7, a)[0]
    assert not layers._agree(a * 1.01, a)[0]
    assert not layers._agree(a.reshape(3, 20), a)[0]


def test_agreement_allows_a_kink_only_where_named():
    """A pass through max()'s kink may differ on a few elements (KINKS), never on many."""
    from cotsdl.bench import peers
    a = np.random.default_rng(0).standard_normal((100, 100)).astype(np.float32)
    b = a.copy()
    b[3, :5] += 1.0  # 5 of 10^4 elements on the other branch
    assert not layers._agree(b, a)[0]
    assert layers._agree(b, a, peers.KINKS["lcn_backward"])[0]
    assert not layers._agree(a * 1.01, a, peers.KINKS["lcn_backward"])[0]
    assert set(peers.KINKS) == {"lcn_backward"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend_name,shape", [("numpy", "D-blocks"), ("cuda-emu", "emu-tiny")])
def test_peer_flag_without_peers_still_runs(tmp_path, backend_name, shape):
    """With torch and jax hidden (as in CI), --peer says so and the bench still runs and writes JSON."""
    hide = tmp_path / "hide"
    hide.mkdir()
    for mod in ("torch", "jax"):
        (hide / f"{mod}.py").write_text("raise ImportError('hidden by the test')\n")
    out = tmp_path / "l.json"
    code = ("import sys; sys.path.insert(0, %r); from cotsdl.cli import main; "
            "sys.exit(main(['bench', 'layers', '--peer', '--repeats', '1', '--min-time', '0', '--json', %r, "
            "'--shapes', %r, '--backend', %r]))"
            % (str(hide), str(out), shape, backend_name))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=280)
    assert res.returncode == 0, res.stderr
    assert "neither PyTorch nor JAX is importable" in res.stdout
    data = json.loads(out.read_text())
    assert data["peers"] == [] and data["peer_devices"] == {} and data["peers_skipped"] == {} and data["complete"]
    assert [r["shape"] for r in data["results"]] == [shape]
    assert "P-paper" in [s.name for s in layers.NUMPY_SHAPES]  # the paper's layer is a default numpy shape
    if backend_name != "numpy":
        return
    for row in data["results"]:  # every filter pass beside its batched products alone
        for name in ("filter_forward", "filter_bwd_data", "filter_bwd_weights"):
            rec = row["ops"][name]
            assert rec["matmul_alone_seconds"] > 0 and rec["fraction_of_matmul_alone"] > 0


def test_interleaved_rounds_call_every_function_alike():
    calls = []
    best = layers.interleaved_best({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3)
    assert calls == ["a", "b"] * 4  # one warm-up each, then three rounds in turn
    assert set(best) == {"a", "b"} and all(t >= 0 for t in best.values())


def _torch():
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return None
    return torch


@pytest.mark.timeout(900)
def test_peer_beside_the_device_path_on_cuda_emu():
    """--backend cuda-emu --peer: the device path's peer code with torch on the CPU (the GPU run's one code
    path, here with arrays on the host); torch.compile for the filter passes only, as beside a GPU."""
    log = io.StringIO()
    with backend.using("cuda-emu"):
        res = layers.run(repeats=1, min_time=0.0, peer=True, log=log, backend_name="cuda-emu", peer_compile="filter")
    have = layers.peers_importable()
    assert res["backend"] == "cuda-emu" and res["peers"] == have
    assert res["peer_devices"] == {p: "cpu" for p in have}
    assert res["peer_compile"] == {"passes": "filter", "budget_seconds_per_shape": None}
    (row,) = res["results"]
    assert set(row["ops"]) == PASSES - {"train_step"}  # cuda-emu times no training step
    if not have:
        assert "neither PyTorch nor JAX is importable" in log.getvalue()
        return
    for name, rec in row["ops"].items():
        for peer, pr in rec["peers"].items():
            assert pr["agrees"], (name, peer, pr)
            assert pr["seconds"] > 0 and pr["ratio"] > 0
            assert ("compile_seconds" in pr) == (peer == "torch-compile")
    by_peer = {p: {n for n, r in row["ops"].items() if p in r["peers"]} for p in have}
    if "torch" in have:
        assert by_peer["torch"] == PASSES - {"train_step"}
        assert by_peer["torch-funfold"] == FUNFOLD - {"train_step"}
        assert by_peer["torch-compile"] == FILTER
        assert "(torch-compile on emu-tiny, cpu: first calls, compiling included: filter_forward" in log.getvalue()
    if "jax" in have:
        assert by_peer["jax"] == FILTER


@pytest.mark.timeout(600)
def test_compile_budget_skips_the_compiled_peer_and_says_so():
    """Past the per-shape compile budget, torch-compile's passes are reported as skipped, not timed; the
    other peers run."""
    if _torch() is None:
        pytest.skip("PyTorch is not importable")
    log, seen = io.StringIO(), []
    with backend.using("cuda-emu"):
        res = layers.run(repeats=1, min_time=0.0, peer=True, log=log, backend_name="cuda-emu",
                         peer_compile_budget=0.0, on_shape=lambda partial: seen.append(json.loads(json.dumps(partial))))
    (row,) = res["results"]
    # the results so far after each shape, for a run stopped by a time limit
    assert [(len(p["results"]), p["complete"]) for p in seen] == [(1, False)] and res["complete"]
    for name, rec in row["ops"].items():
        pr = rec["peers"]["torch-compile"]
        assert pr["agrees"] is None and "budget 0 s" in pr["skipped"] and "seconds" not in pr
        assert rec["peers"]["torch"]["agrees"] and rec["best_peer"]["peer"] != "torch-compile"
        assert f"peer torch-compile on emu-tiny {name}: not compiled" in log.getvalue()
    assert "skip" in log.getvalue()


def test_peer_plan_on_a_gpu(monkeypatch):
    """Beside a GPU: torch on it (when this torch has CUDA), JAX skipped with a reason, torch.compile for the
    filter passes and the step within a budget per shape; on the CPU every pass and no budget."""
    cpu = peers.plan()
    assert cpu.device == "cpu" and cpu.compile == "all" and cpu.compile_budget is None
    assert cpu.names == layers.peers_importable() and all(cpu.compiles(n) for n in PASSES if "torch" in cpu.names)
    torch = _torch()
    if torch is not None and not torch.cuda.is_available():
        no_cuda = peers.plan(gpu=0)
        assert not [p for p in no_cuda.names if p.startswith("torch")]
        assert "has no CUDA" in no_cuda.skipped["torch"] and "has no CUDA" in no_cuda.skipped["torch-compile"]
    if torch is not None:  # a torch that sees one GPU, as the device machine's
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        assert "sees 1 GPU(s), not device 1" in peers.plan(gpu=1).skipped["torch"]
    gpu = peers.plan(gpu=0)
    assert "jax" not in gpu.names
    if "jax" in layers.peers_importable():
        assert gpu.skipped["jax"] == peers.JAX_ON_GPU
    assert (gpu.compile, gpu.compile_budget) == (peers.GPU_COMPILE, peers.GPU_COMPILE_BUDGET) == ("filter", 30.0)
    if torch is not None:
        assert gpu.names == ["torch", "torch-funfold", "torch-compile"] and gpu.on_gpu
        assert gpu.where == {p: "cuda:0" for p in gpu.names}
        assert {n for n in PASSES if gpu.compiles(n)} == FILTER | {"train_step"}
    none = peers.plan(gpu=0, compile="none", compile_budget=5.0)
    assert "torch-compile" not in none.names and none.compile_budget == 5.0
    with pytest.raises(ValueError, match="--peer-compile: 'some'"):
        peers.plan(compile="some")
    with pytest.raises(ValueError, match="--peer-compile-budget must be >= 0"):
        peers.plan(compile_budget=-1.0)


def test_agreement_in_chunks_is_allclose(monkeypatch):
    """The chunked check (gigabyte weights on the device run) decides as one np.isclose over the whole."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((13, 5, 3)).astype(np.float32)
    monkeypatch.setattr(peers, "_AGREE_CHUNK", 7)  # two rows of 15 a chunk
    for b, stray in ((a + 1e-7, 0.0), (a * 1.01, 0.0), (a, 0.0)):
        scale = float(np.abs(a).max())
        want = np.count_nonzero(~np.isclose(b, a, rtol=1e-3, atol=2e-4 * scale)) == 0
        ok, err = peers._agree(b, a, stray)
        assert ok == want and err == pytest.approx(float(np.abs(b.astype(np.float64) - a).max()) / scale)
    b = a.copy()
    b[12, 4, 2] = np.nan  # in the last chunk
    assert not peers._agree(b, a)[0] and not peers._agree(a, b)[0]
    assert peers._agree(np.float32(2.0), np.float32(2.0)) == (True, 0.0)


def test_peer_compile_budget_must_not_be_negative(tmp_path):
    from cotsdl.cli import main  # noqa: PLC0415

    assert main(["bench", "layers", "--backend", "cuda-emu", "--peer", "--peer-compile-budget", "-1",
                 "--json", str(tmp_path / "l.json")]) == 2
    assert not (tmp_path / "l.json").exists()


@pytest.mark.timeout(900)
def test_peer_on_the_cuda_path_with_stand_in_device_arrays(monkeypatch):
    """--backend cuda --peer's own code path on stand-in device arrays (tests/devicestub.py): torch's inputs
    are taken from the device arrays by DLPack, ours are brought to the host for the check, every clock
    waits for torch too, torch's cache is emptied after each shape, and the JSON says the peers ran on
    cuda:0 with JAX skipped.  Only torch's device is the CPU here (no GPU; a stand-in cannot fool torch)."""
    torch = _torch()
    if torch is None:
        pytest.skip("PyTorch is not importable")
    from devicestub import DeviceArray, device_backend  # noqa: PLC0415

    calls = {"synchronize": 0, "empty_cache": 0, "devices": set(), "dlpack": 0}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    count = lambda key: (lambda *a: calls.__setitem__(key, calls[key] + 1))  # noqa: E731
    monkeypatch.setattr(torch.cuda, "synchronize", count("synchronize"))
    monkeypatch.setattr(torch.cuda, "empty_cache", count("empty_cache"))
    real_forms, real_dlpack = peers._torch_formulations, torch.from_dlpack

    def on_the_cpu(sh, data, device):
        calls["devices"].add(device)
        assert all(isinstance(a, DeviceArray) for a in data.values())  # the device's arrays, not host copies
        return real_forms(sh, data, "cpu")

    def from_dlpack(a):
        calls["dlpack"] += 1
        return real_dlpack(a)

    monkeypatch.setattr(peers, "_torch_formulations", on_the_cpu)
    monkeypatch.setattr(torch, "from_dlpack", from_dlpack)
    monkeypatch.setattr(layers, "device_ceilings", lambda: {
        "name": "stand-in", "compute_capability": "0.0", "fp32_peak_GFLOPs": 1e3, "memory_GBps": 1e2,
        "cublas_sgemm_GFLOPs": 5e2})
    monkeypatch.setattr(layers, "ALONE_MAX_WEIGHT_BYTES", 0)  # no cuBLAS batched products on the stand-in
    log = io.StringIO()
    from cotsdl.train import objective  # noqa: PLC0415

    try:
        with device_backend(monkeypatch):
            res = layers.run(repeats=1, min_time=0.0, peer=True, log=log, backend_name="cuda", shapes=[layers.TINY],
                             peer_compile="none")
    finally:  # the training step's one-process plan, cached per shape, holds stand-in device buffers now
        objective._one_process_plan.cache_clear()
    assert calls["devices"] == {"cuda:0"} and calls["dlpack"] == 6  # x, w, dy, y, p, dp: each taken once
    assert calls["empty_cache"] == 1 and calls["synchronize"] > 3 * 8  # every timed call, ours included
    assert res["peers"] == ["torch", "torch-funfold"]
    assert res["peer_devices"] == {"torch": "cuda:0", "torch-funfold": "cuda:0"}
    assert res["peers_skipped"]["torch-compile"] == "--peer-compile none"
    assert res["peer_compile"] == {"passes": "none", "budget_seconds_per_shape": peers.GPU_COMPILE_BUDGET}
    if "jax" in layers.peers_importable():
        assert res["peers_skipped"]["jax"] == peers.JAX_ON_GPU
    (row,) = res["results"]
    assert set(row["ops"]) == PASSES
    for name, rec in row["ops"].items():
        assert set(rec["peers"]) == ({"torch", "torch-funfold"} if name in FUNFOLD else {"torch"})
        for peer, pr in rec["peers"].items():
            assert pr["agrees"], (name, peer, pr)
    assert "(--peer: PyTorch on cuda:0)" in log.getvalue()


def test_a_peer_that_cannot_be_set_up_is_reported_and_the_bench_goes_on(monkeypatch):
    """A failure while a peer's inputs are made (device memory, DLPack) is each pass's error, not the bench's."""
    def broken(*a):
        raise RuntimeError("CUDA out of memory (a stand-in)")

    monkeypatch.setattr(peers, "_torch_formulations", broken)
    monkeypatch.setattr(peers, "_jax_formulations", broken)
    log = io.StringIO()
    res = layers.run(repeats=1, min_time=0.0, peer=True, log=log, shapes=[layers.TINY], peer_compile="none")
    (row,) = res["results"]
    for name, rec in row["ops"].items():
        assert rec["seconds"] > 0 and "best_peer" not in rec
        for peer in res["peers"]:
            assert rec["peers"][peer] == {"agrees": False, "error": "RuntimeError: CUDA out of memory (a stand-in)"}
    if res["peers"]:
        assert "peer torch disagrees on emu-tiny filter_forward: RuntimeError: CUDA out of memory" in log.getvalue()
