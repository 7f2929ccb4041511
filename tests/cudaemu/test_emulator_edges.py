"""Emulator behaviour that real CUDA code relies on, and clear errors where it cannot follow."""
import shutil
from pathlib import Path

import numpy as np
import pytest

from cotsdl.cudaemu import RawModule

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def mod():
    return RawModule(path=HERE / "edges.cu")


def test_atomics_and_fast_math(mod):
    counter, y = np.zeros(2, np.uint32), np.zeros(64, np.float32)
    mod.get_function("count_atomic")((3,), (64,), (counter, y))
    assert counter[0] == 3 * 64 and counter[1] == 63
    np.testing.assert_array_equal(y, 1.0)


def test_min_of_int_and_unsigned_is_unsigned(mod):
    a = np.array([-1, 3, 7, 5] * 8, np.int32)
    out = np.zeros(32, np.uint32)
    mod.get_function("mixed_min")((1,), (32,), (a, out))
    np.testing.assert_array_equal(out, [5, 3, 5, 5] * 8)  # -1 converts to 4294967295 first


def test_disjoint_masks_complete_independently(mod):
    out = np.zeros(32, np.uint32)
    mod.get_function("split_warp")((1,), (32,), (out,))
    np.testing.assert_array_equal(out[:16], 0xAAAA)
    np.testing.assert_array_equal(out[16:], 16)


def test_kernels_in_an_extern_c_block(mod):
    assert {"in_block_a", "in_block_b"} <= set(mod.kernels)


def test_pointer_checks(mod):
    y = np.zeros(64, np.float32)
    y.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        mod.get_function("in_block_a")((1,), (4,), (y,))
    base = np.zeros(32, np.float32)
    assert base.ctypes.data % 16 == 0  # malloc aligns to 16 bytes on x86-64
    with pytest.raises(ValueError, match="misaligned"):
        mod.get_function("write_vec")((1,), (4,), (base[1:17],))
    mod.get_function("write_vec")((1,), (4,), (base[:16],))
    np.testing.assert_array_equal(base[:16].reshape(4, 4), [[1, 2, 3, 4]] * 4)


def test_editing_an_included_header_rebuilds(tmp_path):
    shutil.copy(HERE / "edge_header.cu", tmp_path / "k.cu")
    y = np.zeros(4, np.float32)
    for value in (1.0, 2.0):
        (tmp_path / "edge_value.cuh").write_text(f"#define VALUE {value}f\n")
        RawModule(path=tmp_path / "k.cu").get_function("header_value")((1,), (4,), (y,))
        np.testing.assert_array_equal(y, value)


def test_file_scope_dynamic_shared_is_refused(tmp_path):
    src = tmp_path / "bad.cu"
    src.write_text((HERE / "edge_header.cu").read_text().replace('#include "edge_value.cuh"',
                                                                 "extern __shared__ float buf[];\n#define VALUE 1.f"))
    with pytest.raises(ValueError, match="file scope"):
        RawModule(path=src)
