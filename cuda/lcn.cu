// Separable Gaussian pass of local contrast normalization (DESIGN.md section 3).
//
// Layouts (C-contiguous, N fastest): `in` is (in_h, in_w, N) covering the global box
// [in_r0, in_r0+in_h) x [in_c0, in_c0+in_w); `out` is (out_h, out_w, N) covering
// [out_r0, ...) x [out_c0, ...); g holds `taps` = 2*rho+1 weights.  Along `axis`
// (0: rows, 1: columns):
//     out[a][b][n] = sum_k g[k] * in(global (a, b) shifted by k - rho along axis)[n]
// where `in` reads as 0 outside its box and outside the image [0, img_h) x [0, img_w)
// (the window is cut at the image border).  With `divide`, the result is divided by
// zr[a] * zc[b], the in-bounds weight of the window (border renormalization), so two
// passes (rows, then columns with divide) give the normalized smoothing.
// taps is odd (the wrapper passes the 2*rho+1 factors of cotsdl.ops.lcn.gaussian); zr
// has out_h and zc out_w entries (read only with divide).
// Threads: a 1-D grid of 1-D blocks, one thread per output element, a grid-stride loop
// over the linear index, n fastest (coalesced).  The index is of type I: int in the _i32
// kernels the wrapper launches where every index and one grid-stride step past it fit
// (grids of at most MAX_BLOCKS x 256 threads; cuda/pool.cu says why), else long long,
// where any grid and block size is correct; the wrapper (cotsdl/ops/cuda/lcn.py)
// launches 256 threads a block and at most 4096 blocks.
//
// Compile-time parameters: none (no #define is read from the preamble).
// COTSDL_LCN_INSTANCES(T, I, SUF) defines the extern "C" kernel lcn_corr_axis_SUF for
// element type T (f32: float, f64: double) and index type I (SUF i32_f32 and i32_f64 for int).

template <typename T, typename I>
__device__ void corr_axis(const T* __restrict__ in, T* __restrict__ out, const T* __restrict__ g,
                          const T* __restrict__ zr, const T* __restrict__ zc, int in_r0, int in_c0, int in_h,
                          int in_w, int out_r0, int out_c0, int out_h, int out_w, int N, int axis, int taps,
                          int img_h, int img_w, int divide) {
    const int rho = taps / 2;
    const I total = (I)out_h * out_w * N;
    for (I e = blockIdx.x * (I)blockDim.x + threadIdx.x; e < total; e += (I)gridDim.x * blockDim.x) {
        const I row = e / N;
        const int n = (int)(e - row * N), b = (int)(row % out_w), a = (int)(row / out_w);
        const int r = out_r0 + a, c = out_c0 + b;
        T acc = T(0);
        for (int k = 0; k < taps; ++k) {
            const int rr = axis == 0 ? r + k - rho : r, cc = axis == 1 ? c + k - rho : c;
            if (rr < 0 || rr >= img_h || cc < 0 || cc >= img_w) continue;
            const int li = rr - in_r0, lj = cc - in_c0;
            if (li < 0 || li >= in_h || lj < 0 || lj >= in_w) continue;
            acc += g[k] * in[((long long)li * in_w + lj) * N + n];
        }
        out[e] = divide ? acc / (zr[a] * zc[b]) : acc;
    }
}

#define COTSDL_LCN_INSTANCES(T, I, SUF)                                                                     \
    extern "C" __global__ void lcn_corr_axis_##SUF(const T* __restrict__ in, T* __restrict__ out,          \
            const T* __restrict__ g, const T* __restrict__ zr, const T* __restrict__ zc, int in_r0,         \
            int in_c0, int in_h, int in_w, int out_r0, int out_c0, int out_h, int out_w, int N, int axis,  \
            int taps, int img_h, int img_w, int divide) {                                                 \
        corr_axis<T, I>(in, out, g, zr, zc, in_r0, in_c0, in_h, in_w, out_r0, out_c0, out_h, out_w, N, axis, \
                     taps, img_h, img_w, divide);                                                         \
    }
COTSDL_LCN_INSTANCES(float, long long, f32)
COTSDL_LCN_INSTANCES(double, long long, f64)
COTSDL_LCN_INSTANCES(float, int, i32_f32)
COTSDL_LCN_INSTANCES(double, int, i32_f64)
