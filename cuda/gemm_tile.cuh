// A block-tiled product C[m][n] = sum_k A[m][k] * B[k][n] for one TM x TN tile of C,
// the common core of the locally-connected filter kernels.  The caller supplies the
// index maps: a(m, k) and b(k, n) load an element (0 outside the matrix), and
// store(m, n, v) writes one result.
//
// Threads: (TN/RN) x (TM/RM); each thread owns a contiguous RM x RN block of outputs
// (rows ty*RM.., columns tx*RN..) held in registers.  K is streamed in chunks of TK
// through shared memory; per chunk and k a thread reads RM + RN operands (vector
// loads when RM or RN is a multiple of 4 and T is float) for RM*RN FMAs.
// A_K_FAST / B_N_FAST say which index is contiguous in global memory, so that
// consecutive threads load consecutive addresses (coalescing).
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
#ifndef RM
#define RM 4
#endif
#ifndef RN
#define RN 4
#endif
#define GT_THREADS ((TM / RM) * (TN / RN))
// Rows padded to a multiple of 4 elements (16-byte aligned for float4) plus 4.
#define GT_PAD(X) ((X) + 4)

template <typename T, int R>
__device__ __forceinline__ void gt_read(const T* p, T (&v)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) v[i] = p[i];
}

// float rows of a multiple of 4: 128-bit shared loads.
template <int R>
__device__ __forceinline__ void gt_read(const float* p, float (&v)[R]) {
    if constexpr (R % 4 == 0) {
#pragma unroll
        for (int i = 0; i < R; i += 4) {
            const float4 q = *reinterpret_cast<const float4*>(p + i);
            v[i] = q.x; v[i + 1] = q.y; v[i + 2] = q.z; v[i + 3] = q.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < R; ++i) v[i] = p[i];
    }
}

template <typename T, bool A_K_FAST, bool B_N_FAST, class LA, class LB, class ST>
__device__ __forceinline__ void gemm_tile(int M, int N, int K, int m0, int n0, LA a, LB b, ST store) {
    __shared__ __align__(16) T As[TK][GT_PAD(TM)];
    __shared__ __align__(16) T Bs[TK][GT_PAD(TN)];
    const int tid = threadIdx.y * (TN / RN) + threadIdx.x;
    T acc[RM][RN];
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < RN; ++j) acc[i][j] = T(0);
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
            T av[RM], bv[RN];
            gt_read(&As[kk][threadIdx.y * RM], av);
            gt_read(&Bs[kk][threadIdx.x * RN], bv);
#pragma unroll
            for (int i = 0; i < RM; ++i)
#pragma unroll
                for (int j = 0; j < RN; ++j) acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < RM; ++i) {
        const int m = m0 + threadIdx.y * RM + i;
#pragma unroll
        for (int j = 0; j < RN; ++j) {
            const int n = n0 + threadIdx.x * RN + j;
            if (m < M && n < N) store(m, n, acc[i][j]);
        }
    }
}
