"""``cotsdl bench layers --peer``: runs with or without PyTorch/JAX, checks agreement before timing."""
from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest

from cotsdl.bench import layers

PASSES = {"filter_forward", "filter_bwd_data", "filter_bwd_weights", "pool_forward", "pool_backward",
          "lcn_forward", "lcn_backward", "train_step"}


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
    jax_passes = {n for n, r in row["ops"].items() if "jax" in r["peers"]}
    assert jax_passes == ({"filter_forward", "filter_bwd_data", "filter_bwd_weights"} if "jax" in have else set())


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
def test_peer_flag_without_peers_still_runs(tmp_path):
    """With torch and jax hidden (as in CI), --peer says so and the bench still runs and writes JSON."""
    hide = tmp_path / "hide"
    hide.mkdir()
    for mod in ("torch", "jax"):
        (hide / f"{mod}.py").write_text("raise ImportError('hidden by the test')\n")
    out = tmp_path / "l.json"
    code = ("import sys; sys.path.insert(0, %r); from cotsdl.cli import main; "
            "sys.exit(main(['bench', 'layers', '--peer', '--repeats', '1', '--min-time', '0', '--json', %r, "
            "'--shapes', 'D-blocks']))"
            % (str(hide), str(out)))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=280)
    assert res.returncode == 0, res.stderr
    assert "neither PyTorch nor JAX is importable" in res.stdout
    data = json.loads(out.read_text())
    assert data["peers"] == []
    assert [r["shape"] for r in data["results"]] == ["D-blocks"]
    assert "P-paper" in [s.name for s in layers.NUMPY_SHAPES]  # the paper's layer is a default numpy shape
    for row in data["results"]:  # every filter pass beside its batched products alone
        for name in ("filter_forward", "filter_bwd_data", "filter_bwd_weights"):
            rec = row["ops"][name]
            assert rec["matmul_alone_seconds"] > 0 and rec["fraction_of_matmul_alone"] > 0


def test_interleaved_rounds_call_every_function_alike():
    calls = []
    best = layers.interleaved_best({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3)
    assert calls == ["a", "b"] * 4  # one warm-up each, then three rounds in turn
    assert set(best) == {"a", "b"} and all(t >= 0 for t in best.values())
