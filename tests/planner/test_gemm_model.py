"""The GPU GEMM model of cotsdl.planner.gemm: its calibration point, occupancy and the variants' order."""
from __future__ import annotations

import pytest

from cotsdl.planner import gemm

H100 = gemm.Device(66.9e12, 132)
PAPER_FORWARD_BLOCKS = 92 * 92  # one 128 x 96 tile per site


def test_the_calibration_point_is_reproduced():
    # cuda/README.md: the register-loaded paper forward at one block per SM ran at 0.21 of peak on an H100
    e = gemm.efficiency(128, 96, 16, 1, 1, PAPER_FORWARD_BLOCKS, H100)
    assert e == pytest.approx(0.21, abs=0.01)


def test_resident_blocks_follow_registers_shared_memory_and_threads():
    assert gemm.resident_blocks(256, 128, 14848) == 2      # 128 registers x 256 threads: half the file
    assert gemm.resident_blocks(256, 166, 14848) == 1
    assert gemm.resident_blocks(256, 64, 44544) == 4       # registers would allow 4, shared memory 5
    assert gemm.resident_blocks(256, 32, 100 * 1024) == 2  # shared memory bounds it
    assert gemm.resident_blocks(1024, 32, 0) == 2          # threads bound it
    with pytest.raises(ValueError):
        gemm.resident_blocks(0, 32, 0)


@pytest.mark.parametrize("blocks", [1, 2])
def test_more_stages_are_never_predicted_slower(blocks):
    t = [gemm.seconds(202e9, 128, 96, 16, s, blocks, PAPER_FORWARD_BLOCKS, H100) for s in (1, 2, 3, 4)]
    assert t == sorted(t, reverse=True) and t[0] > t[-1]
    assert all(e <= gemm.ISSUE for e in (gemm.efficiency(128, 96, 16, s, blocks, 10**6, H100) for s in (1, 2, 3, 4)))


def test_no_resident_block_is_infinitely_slow():
    assert gemm.seconds(1e9, 128, 96, 16, 3, 0, 100, H100) == float("inf")
