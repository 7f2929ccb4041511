// L2 pooling (DESIGN.md section 3), forward and backward.
//
// Layouts (C-contiguous, N fastest): x and dx (H, W, C, N); y and dy (PH, PW, C, N) with
//   y[i][j][c][n] = sqrt(eps + sum_{p<ph, q<pw} x[i*qh+p][j*qw+q][c][n]^2),
// window (ph, pw), stride (qh, qw), and PH = (H - ph)/qh + 1, PW = (W - pw)/qw + 1 as the
// wrapper computes them (every window lies inside x; a remainder is not pooled).
// Threads: a 1-D grid of 1-D blocks, one thread per output element (forward) or input
// element (backward), a grid-stride loop over the linear index, n fastest, so loads
// and stores coalesce.  The linear index is of type I: long long (any grid and block
// size is correct), or int in the _i32 kernels, which the wrapper launches when every
// index and one grid-stride step past it fit in an int (so these take grids of at most
// MAX_BLOCKS x 256 threads, as the wrapper launches them); 32-bit divisions decode the
// index for several times less than 64-bit ones (not yet timed against them).  The
// wrapper (cotsdl/ops/cuda/pool.py) launches 256 threads a block and at most 4096 blocks.
// Backward is a gather: each input element sums dy/y over the windows that cover it
// (no atomics); y == 0 contributes nothing.
//
// Compile-time parameters: none (no #define is read from the preamble).
// COTSDL_POOL_INSTANCES(T, I, SUF) defines the extern "C" kernels l2pool_fwd_SUF and
// l2pool_bwd_SUF for element type T (f32: float, f64: double) and index type I (SUF
// i32_f32 and i32_f64 for int).

template <typename T, typename I>
__device__ void pool_fwd(const T* __restrict__ x, T* __restrict__ y, int H, int W, int C, int N, int ph, int pw,
                         int qh, int qw, int PH, int PW, T eps) {
    const I total = (I)PH * PW * C * N;
    for (I e = blockIdx.x * (I)blockDim.x + threadIdx.x; e < total; e += (I)gridDim.x * blockDim.x) {
        const I row = e / N;
        const int n = (int)(e - row * N), c = (int)(row % C), j = (int)((row / C) % PW), i = (int)(row / ((I)C * PW));
        T acc = eps;
        for (int p = 0; p < ph; ++p)
            for (int q = 0; q < pw; ++q) {
                const T v = x[(((long long)(i * qh + p) * W + (j * qw + q)) * C + c) * N + n];
                acc += v * v;
            }
        y[e] = sqrt(acc);
    }
}

template <typename T, typename I>
__device__ void pool_bwd(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ y,
                         T* __restrict__ dx, int H, int W, int C, int N, int ph, int pw, int qh, int qw, int PH, int PW) {
    const I total = (I)H * W * C * N;
    for (I e = blockIdx.x * (I)blockDim.x + threadIdx.x; e < total; e += (I)gridDim.x * blockDim.x) {
        const I row = e / N;
        const int n = (int)(e - row * N), c = (int)(row % C), b = (int)((row / C) % W), a = (int)(row / ((I)C * W));
        // windows i with i*qh <= a < i*qh + ph
        const int i_lo = max(0, (a - ph + qh) / qh), i_hi = min(PH - 1, a / qh);
        const int j_lo = max(0, (b - pw + qw) / qw), j_hi = min(PW - 1, b / qw);
        T g = T(0);
        for (int i = i_lo; i <= i_hi; ++i)
            for (int j = j_lo; j <= j_hi; ++j) {
                const long long o = (((long long)i * PW + j) * C + c) * N + n;
                const T v = y[o];
                if (v > T(0)) g += dy[o] / v;
            }
        dx[e] = g * x[e];
    }
}

#define COTSDL_POOL_INSTANCES(T, I, SUF)                                                                       \
    extern "C" __global__ void l2pool_fwd_##SUF(const T* __restrict__ x, T* __restrict__ y, int H, int W,     \
            int C, int N, int ph, int pw, int qh, int qw, int PH, int PW, T eps) {                           \
        pool_fwd<T, I>(x, y, H, W, C, N, ph, pw, qh, qw, PH, PW, eps);                                          \
    }                                                                                                        \
    extern "C" __global__ void l2pool_bwd_##SUF(const T* __restrict__ dy, const T* __restrict__ x,             \
            const T* __restrict__ y, T* __restrict__ dx, int H, int W, int C, int N, int ph, int pw, int qh,  \
            int qw, int PH, int PW) {                                                                        \
        pool_bwd<T, I>(dy, x, y, dx, H, W, C, N, ph, pw, qh, qw, PH, PW);                                       \
    }
COTSDL_POOL_INSTANCES(float, long long, f32)
COTSDL_POOL_INSTANCES(double, long long, f64)
COTSDL_POOL_INSTANCES(float, int, i32_f32)
COTSDL_POOL_INSTANCES(double, int, i32_f64)
