"""The CPU emulator runs ordinary CUDA kernels correctly, in both thread orders, and finds bugs."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from cotsdl.cudaemu import RawModule, asan_environment

HERE = Path(__file__).resolve().parent
ORDERS = ["forward", "reverse"]


@pytest.fixture(scope="module")
def mod():
    return RawModule(path=HERE / "selftest.cu")


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("n, k, m", [(16, 16, 16), (37, 21, 45), (1, 5, 3), (50, 1, 17)])
def test_tiled_matmul(mod, order, n, k, m):
    rng = np.random.default_rng(n * k * m)
    A, B = rng.standard_normal((n, k), dtype=np.float32), rng.standard_normal((k, m), dtype=np.float32)
    C = np.full((n, m), np.nan, np.float32)
    mod.get_function("matmul_tiled")((-(-m // 16), -(-n // 16)), (16, 16), (A, B, C, np.int32(n), np.int32(k), np.int32(m)),
                                     order=order)
    np.testing.assert_allclose(C, A @ B, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("block", [32, 48, 100, 256, 1024])
def test_block_reduction_with_shuffles_and_partial_warps(mod, order, block):
    n = 3 * block - 7
    x = np.random.default_rng(block).standard_normal(n).astype(np.float32)
    out = np.zeros(3, np.float32)
    mod.get_function("block_sum")((3,), (block,), (x, out, np.int32(n)), order=order)
    expect = [x[b * block:(b + 1) * block].sum() for b in range(3)]
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_histogram_with_atomics(mod, threads):
    data = np.random.default_rng(1).integers(0, 256, 10007).astype(np.uint8)
    hist = np.zeros(256, np.uint32)
    mod.get_function("histogram")((7,), (96,), (data, np.int32(data.size), hist), threads=threads)
    np.testing.assert_array_equal(hist, np.bincount(data, minlength=256))


@pytest.mark.parametrize("order", ORDERS)
def test_dynamic_shared_memory(mod, order):
    n, b = 100, 32
    x = np.arange(n, dtype=np.float32)
    y = np.zeros(n, np.float32)
    mod.get_function("reverse_chunks")((-(-n // b),), (b,), (x, y, np.int32(n)), shared_mem=b * 4, order=order)
    for blk in range(n // b):
        np.testing.assert_array_equal(y[blk * b:(blk + 1) * b], x[blk * b:(blk + 1) * b][::-1])


@pytest.mark.parametrize("order", ORDERS)
def test_scan_ballot_and_syncthreads_count(mod, order):
    x = np.random.default_rng(2).integers(-3, 4, 128).astype(np.int32)
    scan, ballots, pos = np.zeros(128, np.int32), np.zeros(4, np.uint32), np.zeros(2, np.int32)
    mod.get_function("warp_scan")((2,), (64,), (x, scan, ballots, pos), order=order)
    np.testing.assert_array_equal(scan, np.concatenate([np.cumsum(x[w:w + 32]) for w in range(0, 128, 32)]))
    for w in range(4):
        assert ballots[w] == sum(1 << l for l in range(32) if x[w * 32 + l] > 0)
    np.testing.assert_array_equal(pos, [(x[:64] > 0).sum(), (x[64:] > 0).sum()])


def test_missing_syncthreads_shows_in_one_order(mod):
    x = np.arange(64, dtype=np.float32)
    results = {}
    for order in ORDERS:
        y = np.zeros(64, np.float32)
        mod.get_function("missing_sync")((1,), (64,), (x, y), order=order)
        results[order] = y
    correct = 2 * np.roll(x, -1)
    assert not all(np.array_equal(r, correct) for r in results.values()), "the race went unnoticed in both orders"


def test_deadlock_is_reported(mod):
    y = np.zeros(32, np.float32)
    with pytest.raises(RuntimeError, match=r"deadlock in kernel deadlock, block \(0,0,0\)"):
        mod.get_function("deadlock")((1,), (32,), (y,))


def test_arguments_are_checked(mod):
    f = mod.get_function("block_sum")
    x, out = np.zeros(8, np.float32), np.zeros(1, np.float32)
    with pytest.raises(TypeError, match="needs numpy.int32, got int"):
        f((1,), (8,), (x, out, 8))
    with pytest.raises(TypeError, match="needs dtype float32, got float64"):
        f((1,), (8,), (x.astype(np.float64), out, np.int32(8)))
    with pytest.raises(ValueError, match="C-contiguous"):
        f((1,), (8,), (np.zeros(16, np.float32)[::2], out, np.int32(8)))
    with pytest.raises(TypeError, match="takes 3 arguments"):
        f((1,), (8,), (x, out))
    with pytest.raises(ValueError, match="block must be 1 to 3 positive integers"):
        f((1,), (0,), (x, out, np.int32(8)))
    with pytest.raises(RuntimeError, match="1 to 1024 threads"):
        f((1,), (2048,), (x, out, np.int32(8)))
    with pytest.raises(KeyError, match="no extern"):
        mod.get_function("nope")


def test_compile_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void k(float* x) { x[0] = undefined_thing; }\n')
    with pytest.raises(RuntimeError, match="bad.cu"):
        RawModule(path=bad)


def _asan_run(kernel_call: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import numpy as np
        from cotsdl.cudaemu import RawModule
        mod = RawModule(path={str(HERE / 'selftest.cu')!r}, asan=True)
        {kernel_call}
        print("finished")
    """)
    env = {**os.environ, **asan_environment()}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.timeout(300)
def test_asan_names_the_thread_of_an_out_of_bounds_write():
    res = _asan_run("y = np.zeros(64, np.float32); mod.get_function('out_of_bounds')((2,), (32,), (y, np.int32(64)))")
    assert res.returncode != 0 and "finished" not in res.stdout
    assert "AddressSanitizer" in res.stderr
    assert "kernel out_of_bounds, block (1,0,0), thread (5,0,0)" in res.stderr, res.stderr[-3000:]


@pytest.mark.timeout(300)
def test_asan_catches_dynamic_shared_overrun():
    res = _asan_run("y = np.zeros(32, np.float32); mod.get_function('shared_out_of_bounds')((1,), (32,), (y,), shared_mem=32 * 4)")
    assert res.returncode != 0 and "finished" not in res.stdout
    assert "kernel shared_out_of_bounds, block (0,0,0), thread (0,0,0)" in res.stderr, res.stderr[-3000:]


@pytest.mark.timeout(300)
def test_asan_build_runs_correct_kernels_cleanly():
    res = _asan_run(textwrap.dedent("""
        x = np.random.default_rng(0).standard_normal(500).astype(np.float32); out = np.zeros(4, np.float32)
        mod.get_function('block_sum')((4,), (128,), (x, out, np.int32(500)))
        assert np.allclose(out, [x[i*128:(i+1)*128].sum() for i in range(4)], atol=1e-4)
    """).replace("\n", "\n        "))
    assert res.returncode == 0 and "finished" in res.stdout, res.stderr[-3000:]


def test_ucontext_fibers_give_the_same_results():
    mod = RawModule(path=HERE / "selftest.cu", options=("-DCOTSDL_EMU_UCONTEXT",))
    x = np.random.default_rng(3).standard_normal(500).astype(np.float32)
    out = np.zeros(4, np.float32)
    mod.get_function("block_sum")((4,), (128,), (x, out, np.int32(500)))
    np.testing.assert_allclose(out, [x[i * 128:(i + 1) * 128].sum() for i in range(4)], rtol=1e-5, atol=1e-4)
    y = np.zeros(32, np.float32)
    with pytest.raises(RuntimeError, match="deadlock"):
        mod.get_function("deadlock")((1,), (32,), (y,))
