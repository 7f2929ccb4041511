// Block locally-connected filter (DESIGN.md section 3): forward, backward-data,
// backward-weights.  Every site s = (i, j) has its own weights W_s (M x R), M = bh*bw*K,
// R = rh*rw*C, and each pass is one small dense product per site (gemm_tile.cuh).
//
// Layouts (all C-contiguous, N fastest; dx, dw, dy are laid out as x, w, y):
//   x  (H, W, C, N)                 X_s[r][n] = x[i*sh+p][j*sw+q][c][n],  r = (p*rw + q)*C + c
//   w  (SH, SW, M, rh, rw, C)       W_s[m][r] = w[i][j][m][p][q][c]
//   y  (SH*bh, SW*bw, K, N)         Y_s[m][n] = y[i*bh+a][j*bw+b][k][n],  m = (a*bw + b)*K + k
// Index tables replace per-element divisions: xoff[r] is the offset of receptive-field
// element r from the site's corner in x, yoff[m] that of neuron m from the site's
// corner in y (both without the n term); backward-data's `tab` is described at bwd_data.
// They are 32-bit (the wrapper checks that offset + N fits): 64-bit ones cost the
// forward's 128 x 96 tile 121 registers instead of 115 with NVRTC 12.9, and with the
// device's NVRTC 13.2 166 (one block per SM).  Site corners stay 64-bit (Geom).
//
// Grids and threads.  Each kernel is a gemm_tile product; "tiles" is the number of TN
// tiles along the product's column index.  blockIdx.x = (site or cell) * tiles + tile
// (site-major, so the blocks that share a site's weights run together and hit L2; the
// x grid dimension allows 2^31 - 1 blocks), blockIdx.y = tile of TM rows; the block is
// (TN/RN, TM/RM) threads, threadIdx.x over the tile's columns and threadIdx.y over its
// rows, each thread an RM x RN piece of outputs (gemm_tile.cuh).
//   filter_fwd           blockIdx.x: site s = i*SW + j, then N (images) in TN tiles;
//                        blockIdx.y / threadIdx.y: neurons m; threadIdx.x: images n;
//                        K = R streamed.
//   filter_bwd_weights   blockIdx.x: site s, then R (receptive-field elements) in TN
//                        tiles; blockIdx.y / threadIdx.y: neurons m; threadIdx.x: r;
//                        K = N (the images are the reduction) streamed.
//   filter_bwd_data      blockIdx.x: cell (u, v) = u*ceil(W/sw) + v, then N in TN
//                        tiles; blockIdx.y / threadIdx.y: rows (dy, dx, c) of the cell;
//                        threadIdx.x: images n; K = ceil(rh/sh)*ceil(rw/sw)*M streamed.
//   filter_bwd_data_sites  (backward-data by sites, the wrapper's other way) blockIdx.x:
//                        site s = i0*SW + (blockIdx.x / tiles), then N in TN tiles;
//                        blockIdx.y / threadIdx.y: receptive-field elements r;
//                        threadIdx.x: images n; K = M streamed.  Writes P_s = W_s^T dY_s
//                        into buf (sites of one chunk in order, each R x N).
//   filter_col2im        not a GEMM: a grid-stride loop over dx's rows [y0, y1), one
//                        thread per element (y, x, c, n), n fastest across threads; each
//                        adds to dx its pixel's sum over the chunk's candidate sites.
// The wrapper (cotsdl/ops/cuda/filter.py) launches grid (blocks * tiles, ceil(rows/TM))
// with block (TN/RN, TM/RM); filter_col2im with 256-thread blocks, grid-stride.
//
// Compile-time parameters: TM, TN, TK, RM, RN, GT_STAGES (gemm_tile.cuh documents each,
// its range and its default).  The wrapper's _tiles chooses TM, TN, RM and RN, and for the
// 128-row tiles the GEMM variant's GT_STAGES and, where needed, TK = 8; every set it can
// choose is compiled by `cotsdl check-kernels`: the plain build (the defaults, TM = TN =
// 64 with 4 x 4 per thread) and these lines (RM = RN = 4, TK = 16 and GT_STAGES = 1, the
// defaults, where a line gives none).  A new tile or variant in _tiles needs a line here
// (tests/test_check_kernels.py checks).
// check-kernels variant: -DTM=16 -DTN=32
// check-kernels variant: -DTM=16 -DTN=64
// check-kernels variant: -DTM=32 -DTN=32
// check-kernels variant: -DTM=32 -DTN=64
// check-kernels variant: -DTM=64 -DTN=32
// check-kernels variant: -DTM=128 -DTN=64 -DRM=8 -DRN=4
// check-kernels variant: -DTM=128 -DTN=96 -DRM=8 -DRN=6
// check-kernels variant: -DTM=128 -DTN=128 -DRM=8 -DRN=8
// check-kernels variant: -DTM=128 -DTN=64 -DRM=8 -DRN=4 -DGT_STAGES=2
// check-kernels variant: -DTM=128 -DTN=64 -DRM=8 -DRN=4 -DGT_STAGES=3
// check-kernels variant: -DTM=128 -DTN=64 -DRM=8 -DRN=4 -DGT_STAGES=4 -DTK=8
// check-kernels variant: -DTM=128 -DTN=96 -DRM=8 -DRN=6 -DGT_STAGES=2
// check-kernels variant: -DTM=128 -DTN=96 -DRM=8 -DRN=6 -DGT_STAGES=3
// check-kernels variant: -DTM=128 -DTN=96 -DRM=8 -DRN=6 -DGT_STAGES=4 -DTK=8
// check-kernels variant: -DTM=128 -DTN=128 -DRM=8 -DRN=8 -DGT_STAGES=2
// check-kernels variant: -DTM=128 -DTN=128 -DRM=8 -DRN=8 -DGT_STAGES=3 -DTK=8
// check-kernels variant: -DTM=128 -DTN=128 -DRM=8 -DRN=8 -DGT_STAGES=4 -DTK=8
#include "gemm_tile.cuh"

struct Geom {
    int H, W, C, N, SH, SW, rh, rw, sh, sw, bh, bw, K;
    __device__ __forceinline__ long long x_site(int i, int j) const {
        return ((long long)(i * sh) * W + j * sw) * C * (long long)N;
    }
    __device__ __forceinline__ long long y_site(int i, int j) const {
        return ((long long)(i * bh) * (SW * bw) + j * bw) * K * (long long)N;
    }
};

// Y_s = W_s X_s: GEMM (M x R)(R x N).
template <typename T>
__device__ void fwd(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                    const int* __restrict__ xoff, const int* __restrict__ yoff, Geom g) {
    const int tiles = (g.N + TN - 1) / TN, s = blockIdx.x / tiles, i = s / g.SW, j = s % g.SW;
    const int M = g.bh * g.bw * g.K, R = g.rh * g.rw * g.C;
    const T* ws = w + (long long)s * M * R;
    const T* xs = x + g.x_site(i, j);
    T* ys = y + g.y_site(i, j);
    gemm_tile<T, true, true>(
        M, g.N, R, blockIdx.y * TM, (blockIdx.x % tiles) * TN,
        [&](int m, int r) { return ws + (long long)m * R + r; },
        [&](int r, int n) { return xs + xoff[r] + n; },
        [&](int m, int n, T v) { ys[yoff[m] + n] = v; });
}

// dW_s = dY_s X_s^T: GEMM (M x N)(N x R), reduction over the images; tiles over R.
// acc != 0: added to dw (a kept gradient, or the first pair's of a tied layer) instead
// of written over it; each element is read and written by one thread only.
template <typename T>
__device__ void bwd_weights(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dw,
                            const int* __restrict__ xoff, const int* __restrict__ yoff, Geom g,
                            int acc) {
    const int R = g.rh * g.rw * g.C, M = g.bh * g.bw * g.K;
    const int tiles = (R + TN - 1) / TN, s = blockIdx.x / tiles, i = s / g.SW, j = s % g.SW;
    const T* xs = x + g.x_site(i, j);
    const T* dys = dy + g.y_site(i, j);
    T* dws = dw + (long long)s * M * R;
    gemm_tile<T, true, false>(
        M, R, g.N, blockIdx.y * TM, (blockIdx.x % tiles) * TN,
        [&](int m, int n) { return dys + yoff[m] + n; },
        [&](int n, int r) { return xs + xoff[r] + n; },
        [&](int m, int r, T v) {
            T* o = dws + (long long)m * R + r;
            *o = acc ? *o + v : v;
        });
}

// Backward-data as a gather (no atomics).  The input is cut into cells of sh x sw
// pixels; all pixels of cell (u, v) are covered only by the ci x cj candidate sites
// i = u - ti, j = v - tj (ci = ceil(rh/sh), cj = ceil(rw/sw)), and a pixel at (dy, dx)
// in its cell sits at receptive-field position (p, q) = (dy + ti*sh, dx + tj*sw) of
// candidate (ti, tj) -- the same for every cell.  So each cell is one GEMM
//     dx[(dy, dx, c)][n] = sum_{(ti, tj, m)} W_s[m][(p, q, c)] dY_s[m][n]
// with rows (dy, dx, c) (sh*sw*C of them) and K = ci*cj*M; a (p, q) outside the field,
// or a candidate site outside the grid, contributes 0.  tab holds the decoded indices:
// rows rdy, rdx, rc (R0 = sh*sw*C each) then K entries kti, ktj, km (K0 = ci*cj*M each).
// blockIdx.x = cell * tiles + tile along n.
template <typename T>
__device__ void bwd_data(const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx,
                         const int* __restrict__ tab, const int* __restrict__ yoff, Geom g) {
    const int tiles = (g.N + TN - 1) / TN, cell = blockIdx.x / tiles;
    const int CW = (g.W + g.sw - 1) / g.sw, u = cell / CW, v = cell % CW;
    const int M = g.bh * g.bw * g.K, R = g.rh * g.rw * g.C;
    const int ci = (g.rh + g.sh - 1) / g.sh, cj = (g.rw + g.sw - 1) / g.sw;
    const int R0 = g.sh * g.sw * g.C, K0 = ci * cj * M;
    const int *rdy = tab, *rdx = tab + R0, *rc = tab + 2 * R0;
    const int *kti = tab + 3 * R0, *ktj = kti + K0, *km = ktj + K0;
    gemm_tile<T, false, true>(
        R0, g.N, K0, blockIdx.y * TM, (blockIdx.x % tiles) * TN,
        [&](int r, int k) {
            const int i = u - kti[k], j = v - ktj[k];
            const int p = rdy[r] + kti[k] * g.sh, q = rdx[r] + ktj[k] * g.sw;
            if (i < 0 || j < 0 || i >= g.SH || j >= g.SW || p >= g.rh || q >= g.rw) return (const T*)nullptr;
            return w + ((long long)(i * g.SW + j) * M + km[k]) * R + (p * g.rw + q) * g.C + rc[r];
        },
        [&](int k, int n) {
            const int i = u - kti[k], j = v - ktj[k];
            if (i < 0 || j < 0 || i >= g.SH || j >= g.SW) return (const T*)nullptr;
            return dy + g.y_site(i, j) + yoff[km[k]] + n;
        },
        [&](int r, int n, T val) {
            const int y0 = u * g.sh + rdy[r], x0 = v * g.sw + rdx[r];
            if (y0 < g.H && x0 < g.W) dx[(((long long)y0 * g.W + x0) * g.C + rc[r]) * g.N + n] = val;
        });
}

// Backward-data by sites: P_s = W_s^T dY_s, GEMM (R x M)(M x N), for the sites of rows
// [i0, i0 + chunk) into buf (site s - i0*SW at buf + (s - i0*SW)*R*N, rows r, columns n);
// filter_col2im then sums them into dx.  The products are the forward's shape
// transposed (large R rows, all M as the reduction), so they take the large tiles the
// gather's sh*sw*C rows cannot; the price is buf, R*N numbers per site (the wrapper
// bounds a chunk's).
template <typename T>
__device__ void bwd_data_sites(const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ buf,
                               const int* __restrict__ yoff, Geom g, int i0) {
    const int tiles = (g.N + TN - 1) / TN, local = blockIdx.x / tiles;
    const int s = i0 * g.SW + local, i = s / g.SW, j = s % g.SW;
    const int M = g.bh * g.bw * g.K, R = g.rh * g.rw * g.C;
    const T* ws = w + (long long)s * M * R;
    const T* dys = dy + g.y_site(i, j);
    T* bs = buf + (long long)local * R * g.N;
    gemm_tile<T, false, true>(
        R, g.N, M, blockIdx.y * TM, (blockIdx.x % tiles) * TN,
        [&](int r, int m) { return ws + (long long)m * R + r; },
        [&](int m, int n) { return dys + yoff[m] + n; },
        [&](int r, int n, T v) { bs[(long long)r * g.N + n] = v; });
}

// dx[y][x][c][n] += sum over the sites (i, j), i in [i0, i1), whose field covers (y, x),
// of buf's P_s[((y - i*sh)*rw + (x - j*sw))*C + c][n], for the rows y in [y0, y1).
// Site i covers y when i*sh <= y < i*sh + rh: i from ceil((y - rh + 1)/sh) to floor(y/sh).
// Each dx element is owned by one thread (no atomics); the sum's order is fixed.
template <typename T>
__device__ void col2im(const T* __restrict__ buf, T* __restrict__ dx, Geom g, int i0, int i1, int y0, int y1) {
    const int R = g.rh * g.rw * g.C;
    const long long total = (long long)(y1 - y0) * g.W * g.C * g.N;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const int n = (int)(e % g.N);
        long long t = e / g.N;
        const int c = (int)(t % g.C);
        t /= g.C;
        const int x = (int)(t % g.W), y = y0 + (int)(t / g.W);
        const int ilo = max(i0, y - g.rh + 1 > 0 ? (y - g.rh + g.sh) / g.sh : 0);
        const int ihi = min(i1 - 1, y / g.sh);
        const int jlo = x - g.rw + 1 > 0 ? (x - g.rw + g.sw) / g.sw : 0;
        const int jhi = min(g.SW - 1, x / g.sw);
        T sum = T(0);
        for (int i = ilo; i <= ihi; ++i)
            for (int j = jlo; j <= jhi; ++j) {
                const int r = ((y - i * g.sh) * g.rw + (x - j * g.sw)) * g.C + c;
                sum += buf[((long long)((i - i0) * g.SW + j) * R + r) * g.N + n];
            }
        dx[e + (long long)y0 * g.W * g.C * g.N] += sum;
    }
}

// GEOM_PARAMS: the 13 int geometry parameters every filter kernel ends with, in the
// order the wrapper passes them (_geom in cotsdl/ops/cuda/filter.py): input (H, W, C, N),
// site grid (SH, SW), receptive field (rh, rw), stride (sh, sw), block (bh, bw), K maps.
// GEOM_ARGS: the brace list that builds a Geom from them.
#define GEOM_PARAMS int H, int W, int C, int N, int SH, int SW, int rh, int rw, int sh, int sw, int bh, int bw, int K
#define GEOM_ARGS {H, W, C, N, SH, SW, rh, rw, sh, sw, bh, bw, K}
// COTSDL_FILTER_INSTANCES(T, SUF): the extern "C" kernels for element type T, named
// filter_{fwd,bwd_data,bwd_weights,bwd_data_sites,col2im}_SUF (the wrapper appends f32
// or f64).  filter_bwd_data_sites takes xoff unused, so that every GEMM kernel takes
// the same (operands, table, yoff, geometry) arguments.
// __launch_bounds__(GT_THREADS, 1): blocks of at most GT_THREADS threads (the launch
// uses exactly that many), and one resident block per SM is enough, so ptxas keeps
// registers x GT_THREADS within the register file but otherwise may use up to 255
// registers a thread for the RM x RN accumulators; check-kernels reports the count
// and fails on any spill.  The float32 forward asks for two blocks per SM
// (FWD_MIN_BLOCKS: at most 128 registers for 256 threads) except on the 128 x 128 tile,
// whose 64 accumulators would spill: on an H100 the paper layer's forward took 14.6 ms
// at one block per SM (166 registers, 8 warps) and 9.6 ms at two (cuda/README.md; measured with
// the 64-bit tables of the time and a 24-byte spill; the 32-bit build is not re-timed yet).
#define FWD_MIN_BLOCKS (TM * TN > 128 * 96 ? 1 : 2)
#define COTSDL_FILTER_INSTANCES(T, SUF, FWD_MINB)                                                                  \
    extern "C" __global__ void __launch_bounds__(GT_THREADS, FWD_MINB) filter_fwd_##SUF(                            \
            const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,                          \
            const int* __restrict__ xoff, const int* __restrict__ yoff, GEOM_PARAMS) {        \
        fwd<T>(x, w, y, xoff, yoff, Geom GEOM_ARGS);                                                    \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(GT_THREADS, 1) filter_bwd_data_##SUF(                       \
            const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx,                        \
            const int* __restrict__ tab, const int* __restrict__ yoff, GEOM_PARAMS) {               \
        bwd_data<T>(dy, w, dx, tab, yoff, Geom GEOM_ARGS);                                              \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(GT_THREADS, 1) filter_bwd_weights_##SUF(                    \
            const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dw,                        \
            const int* __restrict__ xoff, const int* __restrict__ yoff, GEOM_PARAMS, int acc) { \
        bwd_weights<T>(x, dy, dw, xoff, yoff, Geom GEOM_ARGS, acc);                                     \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(GT_THREADS, 1) filter_bwd_data_sites_##SUF(                 \
            const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ buf,                       \
            const int* __restrict__ xoff, const int* __restrict__ yoff, GEOM_PARAMS, int i0) { \
        bwd_data_sites<T>(dy, w, buf, yoff, Geom GEOM_ARGS, i0);                                        \
    }                                                                                                   \
    extern "C" __global__ void filter_col2im_##SUF(const T* __restrict__ buf, T* __restrict__ dx,         \
                                                   GEOM_PARAMS, int i0, int i1, int y0, int y1) {        \
        col2im<T>(buf, dx, Geom GEOM_ARGS, i0, i1, y0, y1);                                             \
    }
COTSDL_FILTER_INSTANCES(float, f32, FWD_MIN_BLOCKS)
// float64 with the small tiles only (TM <= 64): _tiles never gives float64 a 128-row
// tile, and the 128 x 128 one (64 double accumulators per thread) would spill
// (filter_fwd_f64 reaches the 255-register cap), which check-kernels rejects.
#if TM <= 64
COTSDL_FILTER_INSTANCES(double, f64, 1)
#endif
