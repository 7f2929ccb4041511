"""The emulator's cp.async stand-in, through the helpers the GEMM tile uses (cuda/gemm_tile.cuh):
a copy lands when its group is waited for (late) or at issue (early), and wait_group N leaves the
newest N groups in flight."""
import numpy as np
import pytest

from cotsdl import backend
from cotsdl.cudaemu import RawModule

SOURCE = r"""
#include "gemm_tile.cuh"
// Two groups of one copy each into a stage that holds -1; mode 0: no wait, 1: wait_group 1 (the
// older group has landed), 2: wait_group 0 (both).  Each thread reads back only its own copies.
extern "C" __global__ void two_groups(const float* src, float* out, int mode) {
    __shared__ float s[2][32];
    const int t = threadIdx.x;
    s[0][t] = -1.0f;
    s[1][t] = -1.0f;
    gt_copy_async(&s[0][t], src + t);
    gt_commit();
    gt_copy_async(&s[1][t], src + 32 + t);
    gt_commit();
    if (mode == 1) gt_wait<1>();
    if (mode == 2) gt_wait<0>();
    out[t] = s[0][t];
    out[32 + t] = s[1][t];
}
"""


@pytest.fixture(scope="module")
def kern():
    mod = RawModule(code=SOURCE, options=(f"-I{backend.cuda_dir()}",))
    return mod.get_function("two_groups")


@pytest.mark.parametrize("copies, mode, landed", [
    ("late", 0, (False, False)), ("late", 1, (True, False)), ("late", 2, (True, True)),
    ("early", 0, (True, True)), ("early", 1, (True, True)), ("early", 2, (True, True))])
def test_a_copy_lands_when_its_group_is_waited_for_or_at_issue(kern, monkeypatch, copies, mode, landed):
    monkeypatch.setenv("COTSDL_EMU_ASYNC", copies)
    src = np.arange(64, dtype=np.float32)
    out = np.zeros(64, np.float32)
    kern((1,), (32,), (src, out, np.int32(mode)))
    for half, done in zip((slice(0, 32), slice(32, 64)), landed):
        np.testing.assert_array_equal(out[half], src[half] if done else -1.0)


def test_the_copy_mode_is_checked(kern, monkeypatch):
    monkeypatch.setenv("COTSDL_EMU_ASYNC", "sometimes")
    with pytest.raises(ValueError, match="COTSDL_EMU_ASYNC must be 'late' or 'early'"):
        kern((1,), (32,), (np.zeros(64, np.float32), np.zeros(64, np.float32), np.int32(0)))
