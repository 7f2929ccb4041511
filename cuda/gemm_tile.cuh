// A block-tiled product C[m][n] = sum_k A[m][k] * B[k][n] for one TM x TN tile of C,
// the common core of the locally-connected filter kernels.  The caller supplies the
// index maps: a(m, k) and b(k, n) load an element (0 outside the matrix), and
// store(m, n, v) writes one result.  Tiles: TM x TN outputs per block of
// (TN/4) x (TM/4) threads, each thread a 4 x 4 register tile; K is streamed in chunks
// of TK through shared memory.  A_K_FAST / B_N_FAST tell which index is contiguous in
// memory, so that consecutive threads load consecutive addresses (coalescing).
#pragma once
#ifndef TM
#define TM 64
#endif
#ifndef TN
#define TN 64
#endif
#ifndef TK
#define TK 16
#endif
#define GT_THREADS ((TM / 4) * (TN / 4))

template <typename T, bool A_K_FAST, bool B_N_FAST, class LA, class LB, class ST>
__device__ __forceinline__ void gemm_tile(int M, int N, int K, int m0, int n0, LA a, LB b, ST store) {
    __shared__ T As[TK][TM + 1];
    __shared__ T Bs[TK][TN + 1];
    const int tid = threadIdx.y * (TN / 4) + threadIdx.x;
    T acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = T(0);
    for (int k0 = 0; k0 < K; k0 += TK) {
        for (int e = tid; e < TM * TK; e += GT_THREADS) {
            int mm, kk;
            if (A_K_FAST) { kk = e % TK; mm = e / TK; } else { mm = e % TM; kk = e / TM; }
            const int m = m0 + mm, k = k0 + kk;
            As[kk][mm] = (m < M && k < K) ? a(m, k) : T(0);
        }
        for (int e = tid; e < TK * TN; e += GT_THREADS) {
            int kk, nn;
            if (B_N_FAST) { nn = e % TN; kk = e / TN; } else { kk = e % TK; nn = e / TK; }
            const int k = k0 + kk, n = n0 + nn;
            Bs[kk][nn] = (k < K && n < N) ? b(k, n) : T(0);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TK; ++kk) {
            T av[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) av[i] = As[kk][threadIdx.y + i * (TM / 4)];
#pragma unroll
            for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][threadIdx.x + j * (TN / 4)];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int m = m0 + threadIdx.y + i * (TM / 4);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = n0 + threadIdx.x + j * (TN / 4);
            if (m < M && n < N) store(m, n, acc[i][j]);
        }
    }
}
