"""Direct, loop-level implementations of DESIGN.md section 3: slow and obviously correct."""
import math

import numpy as np


def local_filter(x, w, stride, block):
    H, W, C, N = x.shape
    SH, SW, M, rh, rw, _ = w.shape
    bh, bw = block
    K = M // (bh * bw)
    y = np.zeros((SH * bh, SW * bw, K, N))
    for i in range(SH):
        for j in range(SW):
            for a in range(bh):
                for b in range(bw):
                    for k in range(K):
                        acc = np.zeros(N)
                        for p in range(rh):
                            for q in range(rw):
                                for c in range(C):
                                    acc += w[i, j, (a * bw + b) * K + k, p, q, c] * x[i * stride[0] + p, j * stride[1] + q, c]
                        y[i * bh + a, j * bw + b, k] = acc
    return y


def l2_pool(x, size, stride, eps):
    H, W, C, N = x.shape
    PH, PW = (H - size[0]) // stride[0] + 1, (W - size[1]) // stride[1] + 1
    y = np.zeros((PH, PW, C, N))
    for i in range(PH):
        for j in range(PW):
            for c in range(C):
                for n in range(N):
                    s = eps
                    for p in range(size[0]):
                        for q in range(size[1]):
                            s += x[i * stride[0] + p, j * stride[1] + q, c, n] ** 2
                    y[i, j, c, n] = math.sqrt(s)
    return y


def lcn(x, size, sigma, eps):
    H, W, C, N = x.shape
    r = size // 2
    g = np.array([[math.exp(-((p - r) ** 2 + (q - r) ** 2) / (2 * sigma ** 2)) for q in range(size)]
                  for p in range(size)])

    def smooth(u):  # u (H, W, C, N) -> (H, W, N)
        out = np.zeros((H, W, N))
        for i in range(H):
            for j in range(W):
                z = 0.0
                acc = np.zeros(N)
                for p in range(size):
                    for q in range(size):
                        a, b = i + p - r, j + q - r
                        if 0 <= a < H and 0 <= b < W:
                            z += g[p, q]
                            for c in range(C):
                                acc += g[p, q] / C * u[a, b, c]
                out[i, j] = acc / z
        return out

    mu = smooth(x)
    v = x - mu[:, :, None, :]
    s = np.sqrt(smooth(v * v))
    m = s.mean(axis=(0, 1))
    d = np.maximum(np.maximum(s, m[None, None, :]), eps)
    return v / d[:, :, None, :]
