"""FLOP and byte counts of every operation (DESIGN.md section 6).

Bytes are the fewest a pass must move through memory: every input read once and
every output written once, at ``itemsize`` bytes per element.  FLOPs count a
multiply-add as two.
"""
from __future__ import annotations

from dataclasses import dataclass

from .shapes import window_sites


@dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float


def local_filter(H: int, W: int, C: int, N: int, size, stride, block, K: int, itemsize: int = 4) -> dict[str, Cost]:
    """Forward, backward-data and backward-weights of the block locally-connected filter.

    Each pass is S per-site products of (M x R)(R x N): 2*S*M*R*N FLOPs, S sites,
    M = bh*bw*K, R = rh*rw*C.  The weights (S*M*R) are read or written once per pass.
    """
    (rh, rw), (sh, sw), (bh, bw) = size, stride, block
    SH, SW = window_sites((H, W), (rh, rw), (sh, sw))
    S = SH * SW
    M, R = bh * bw * K, rh * rw * C
    flops = 2.0 * S * M * R * N
    x, w, y = H * W * C * N, S * M * R, S * M * N
    return {
        "forward": Cost(flops, itemsize * (x + w + y)),
        "backward_data": Cost(flops, itemsize * (y + w + x)),
        "backward_weights": Cost(flops, itemsize * (x + y + w)),
    }


def l2_pool(H: int, W: int, C: int, N: int, size, stride, itemsize: int = 4) -> dict[str, Cost]:
    """Forward: a square and an add per window element, a sqrt per output (counted as 1).

    Backward: dy/y per output, a multiply-add per window element, a final multiply by x;
    it reads dy, x and y and writes dx.
    """
    (ph, pw), (qh, qw) = size, stride
    PH, PW = window_sites((H, W), (ph, pw), (qh, qw))
    P = PH * PW * C * N
    x = H * W * C * N
    return {
        "forward": Cost(P * (2.0 * ph * pw + 1), itemsize * (x + P)),
        "backward": Cost(P * (1.0 + 2.0 * ph * pw) + x, itemsize * (2 * P + 2 * x)),
    }


def lcn(H: int, W: int, C: int, N: int, size: int, itemsize: int = 4) -> dict[str, Cost]:
    """LCN: two channel sums (2 HWCN), two separable smoothings (2 * 2 * 2(2rho+1) HWN),
    centering and squaring (3 HWCN), one divide (HWCN); backward about twice that.
    It reads x and writes y (forward), reads x and dy and writes dx (backward).
    """
    P, Q = H * W * C * N, H * W * N
    fwd = 6.0 * P + 8.0 * size * Q
    return {"forward": Cost(fwd, itemsize * 2 * P), "backward": Cost(2 * fwd, itemsize * 3 * P)}
