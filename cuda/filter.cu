// Block locally-connected filter (DESIGN.md section 3): forward, backward-data,
// backward-weights.  Every site s = (i, j) has its own weights W_s (M x R), M = bh*bw*K,
// R = rh*rw*C, and each pass is one small dense product per site (gemm_tile.cuh).
//
// Layouts (all C-contiguous, N fastest):
//   x  (H, W, C, N)                 X_s[r][n] = x[i*sh+p][j*sw+q][c][n],  r = (p*rw + q)*C + c
//   w  (SH, SW, M, rh, rw, C)       W_s[m][r] = w[i][j][m][p][q][c]
//   y  (SH*bh, SW*bw, K, N)         Y_s[m][n] = y[i*bh+a][j*bw+b][k][n],  m = (a*bw + b)*K + k
// Grids: blockIdx.x is the site (forward, backward-weights) or the input pixel
// (backward-data) -- the x grid dimension allows 2^31 - 1 blocks --, blockIdx.y tiles
// the GEMM's M index, blockIdx.z its N index; threads are (TN/4, TM/4), each a 4 x 4
// tile of outputs.
// The wrappers (cotsdl/ops/cudakernels.py) choose TM in {16, 32, 64} and TN in {32, 64}:
// check-kernels variant: -DTM=16 -DTN=32
// check-kernels variant: -DTM=16 -DTN=64
// check-kernels variant: -DTM=32 -DTN=32
// check-kernels variant: -DTM=32 -DTN=64
// check-kernels variant: -DTM=64 -DTN=32
#include "gemm_tile.cuh"

struct Geom {
    int H, W, C, N, SH, SW, rh, rw, sh, sw, bh, bw, K;
    __device__ __forceinline__ long long x_at(int i, int j, int r, int n) const {
        const int c = r % C, q = (r / C) % rw, p = r / (C * rw);
        return (((long long)(i * sh + p) * W + (j * sw + q)) * C + c) * N + n;
    }
    __device__ __forceinline__ long long y_at(int i, int j, int m, int n) const {
        const int k = m % K, b = (m / K) % bw, a = m / (K * bw);
        return (((long long)(i * bh + a) * (SW * bw) + (j * bw + b)) * K + k) * N + n;
    }
};

// Y_s = W_s X_s: GEMM (M x R)(R x N).  blockIdx.x = site.
template <typename T>
__device__ void fwd(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, Geom g) {
    const int s = blockIdx.x, i = s / g.SW, j = s % g.SW;
    const int M = g.bh * g.bw * g.K, R = g.rh * g.rw * g.C;
    const T* ws = w + (long long)s * M * R;
    gemm_tile<T, true, true>(
        M, g.N, R, blockIdx.y * TM, blockIdx.z * TN,
        [&](int m, int r) { return ws[(long long)m * R + r]; },
        [&](int r, int n) { return x[g.x_at(i, j, r, n)]; },
        [&](int m, int n, T v) { y[g.y_at(i, j, m, n)] = v; });
}

// dW_s = dY_s X_s^T: GEMM (M x N)(N x R), reduction over the images.  blockIdx.x = site.
template <typename T>
__device__ void bwd_weights(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dw, Geom g) {
    const int s = blockIdx.x, i = s / g.SW, j = s % g.SW;
    const int M = g.bh * g.bw * g.K, R = g.rh * g.rw * g.C;
    T* dws = dw + (long long)s * M * R;
    gemm_tile<T, true, false>(
        M, R, g.N, blockIdx.y * TM, blockIdx.z * TN,
        [&](int m, int n) { return dy[g.y_at(i, j, m, n)]; },
        [&](int n, int r) { return x[g.x_at(i, j, r, n)]; },
        [&](int m, int r, T v) { dws[(long long)m * R + r] = v; });
}

// dx[y0][x0][c][n] = sum over the sites covering pixel (y0, x0) and their M neurons of
// W_s[m][(p, q, c)] dY_s[m][n]: a gather (no atomics), one GEMM (C x S'M)(S'M x N) per
// pixel, S' the covering sites.  blockIdx.x = pixel y0*W + x0; GEMM rows are channels.
template <typename T>
__device__ void bwd_data(const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx, Geom g) {
    const int y0 = blockIdx.x / g.W, x0 = blockIdx.x % g.W;
    const int M = g.bh * g.bw * g.K, R = g.rh * g.rw * g.C;
    // sites i with i*sh <= y0 < i*sh + rh, i in [0, SH)
    const int i_lo = max(0, (y0 - g.rh + g.sh) / g.sh), i_hi = min(g.SH - 1, y0 / g.sh);
    const int j_lo = max(0, (x0 - g.rw + g.sw) / g.sw), j_hi = min(g.SW - 1, x0 / g.sw);
    const int ni = i_hi - i_lo + 1, nj = j_hi - j_lo + 1;
    const int S = (ni > 0 && nj > 0) ? ni * nj : 0;
    gemm_tile<T, false, true>(
        g.C, g.N, S * M, blockIdx.y * TM, blockIdx.z * TN,
        [&](int c, int km) {
            const int t = km / M, m = km % M, i = i_lo + t / nj, j = j_lo + t % nj;
            const int r = ((y0 - i * g.sh) * g.rw + (x0 - j * g.sw)) * g.C + c;
            return w[((long long)(i * g.SW + j) * M + m) * R + r];
        },
        [&](int km, int n) {
            const int t = km / M, m = km % M, i = i_lo + t / nj, j = j_lo + t % nj;
            return dy[g.y_at(i, j, m, n)];
        },
        [&](int c, int n, T v) { dx[(((long long)y0 * g.W + x0) * g.C + c) * g.N + n] = v; });
}

#define GEOM_PARAMS int H, int W, int C, int N, int SH, int SW, int rh, int rw, int sh, int sw, int bh, int bw, int K
#define GEOM_ARGS {H, W, C, N, SH, SW, rh, rw, sh, sw, bh, bw, K}
#define COTSDL_FILTER_INSTANCES(T, SUF)                                                                  \
    extern "C" __global__ void __launch_bounds__(GT_THREADS) filter_fwd_##SUF(                            \
            const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y, GEOM_PARAMS) {          \
        fwd<T>(x, w, y, Geom GEOM_ARGS);                                                                \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(GT_THREADS) filter_bwd_data_##SUF(                       \
            const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx, GEOM_PARAMS) {        \
        bwd_data<T>(dy, w, dx, Geom GEOM_ARGS);                                                         \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(GT_THREADS) filter_bwd_weights_##SUF(                    \
            const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dw, GEOM_PARAMS) {        \
        bwd_weights<T>(x, dy, dw, Geom GEOM_ARGS);                                                      \
    }
COTSDL_FILTER_INSTANCES(float, f32)
COTSDL_FILTER_INSTANCES(double, f64)
