// A block-tiled product C[m][n] = sum_k A[m][k] * B[k][n] for one TM x TN tile of C,
// the common core of the locally-connected filter kernels (filter.cu).  The caller
// supplies the index maps: a(m, k) and b(k, n) give the address of an element (nullptr
// for an element that is 0; they are called only inside the matrix), store(m, n, v)
// writes one result, and (m0, n0), the tile's first row and column, comes from the
// caller's block index (filter.cu says which).
//
// Layout.  A, B and C are never addressed here: only through the caller's maps, so the
// tensors' layouts are filter.cu's.  Shared memory holds GT_STAGES K chunks of each
// operand, both k-major: As[stage][k][m] (A transposed) and Bs[stage][k][n], rows padded
// to GT_PAD elements.  Threads: a (TN/RN) x (TM/RM) block.  threadIdx.x covers the tile's
// TN columns (n), RN consecutive ones each (n0 + tx*RN ..); threadIdx.y covers its TM
// rows (m), RM consecutive ones each (m0 + ty*RM ..); each thread holds its RM x RN
// outputs in registers.  K is streamed in chunks of TK: all threads load a chunk of A and
// B (flat index tid = ty*(TN/RN) + tx, stride GT_THREADS), then per k a thread reads
// RM + RN operands (128-bit loads when the count is a multiple of 4 and T is float) for
// RM*RN FMAs.  A_K_FAST / B_N_FAST say which index is contiguous in global memory; the
// chunk loads walk that index fastest across consecutive threads, so that they read
// consecutive addresses (coalescing).
//
// Loading (GT_STAGES).  1: each chunk is loaded through registers and multiplied between
// two barriers (no overlap of a chunk's loads with the previous chunk's FMAs except
// across warps).  2 to 4: a multistage pipeline: chunk c + GT_STAGES - 1 is in flight
// (cp.async, global -> shared without registers, sm_80 and newer) while chunk c is
// multiplied, one barrier per chunk.  Elsewhere the copies are plain loads (sm_70; the
// same schedule, nothing in flight), and in the CPU emulator they go through its
// cp.async stand-in (cotsdl/cudaemu: a copy lands when its group is waited for, or
// with COTSDL_EMU_ASYNC=early at issue, the two extremes the PTX rules allow).
#pragma once

// ---- Compile-time parameters -------------------------------------------------------
// They come from the #define preamble of cotsdl/backend.py (kernel(file, fn, defines)).
// The filter wrapper (_tiles in cotsdl/ops/cuda/filter.py) always passes TM, TN, RM and
// RN, and with a cp.async variant of a 128-row tile GT_STAGES and, where 16 would not fit,
// TK = 8; every combination it can pick is built by `cotsdl check-kernels`
// (the "check-kernels variant" lines of filter.cu plus the plain build with the
// defaults below, which is itself one of the wrapper's tiles: keep it so).
//
// TM: rows (m) of the output tile; blockIdx.y steps over M in TM rows.  The wrapper
//     picks 16, 32 or 64 (the smallest that covers M, else 64, so small products idle
//     fewer threads) with 4 x 4 micro-tiles, and 128 (with RM = 8) for float32 products with
//     M >= 128 and N >= 64.  Must be a positive multiple of RM (checked below).
//     Default 64: the wrapper's tile for every M > 32 that does not get the 128-row
//     tile (all of them in float64).
#ifndef TM
#define TM 64
#endif
// TN: columns (n) of the output tile; the caller's blockIdx.x steps over N in TN
//     columns.  The wrapper picks 32 or 64 for the small tiles, and 64, 96 or 128 for
//     the 128-row tiles (the one that wastes the fewest columns of N; 96 fits N = 96).
//     Must be a positive multiple of RN (checked below).  Default 64: the wrapper's
//     small tile for N > 32.
#ifndef TN
#define TN 64
#endif
// TK: depth of one K chunk in shared memory.  Any positive value is correct (the last
//     chunk is zero-padded); the wrapper passes 8 only where GT_STAGES chunks of 16 would
//     not fit.  Default 16: the barriers of a chunk are shared by TK*RM*RN FMAs per
//     thread, the K-fast operand is read in runs of TK consecutive elements (64 bytes of
//     float), and the static shared memory GT_STAGES*TK*(TM + TN + 8)*sizeof(T) stays
//     within the 48 KiB limit (checked in gemm_tile below): at most 17 KiB through
//     registers (the 128 x 128 float tile 16.5 KiB, the 64 x 64 double one 17 KiB), at
//     most 44.5 KiB in the pipelines (the 128 x 96 tile, 3 stages).
#ifndef TK
#define TK 16
#endif
// RM: rows of outputs per thread (registers: RM*RN accumulators plus RM + RN operands
//     per k).  The wrapper uses 4 with TM <= 64 and 8 with TM = 128.  Must divide TM;
//     a multiple of 4 gives 128-bit shared loads of float.  How large RM*RN may be is
//     bounded by registers: check-kernels fails on any spill (8 x 8 float is the
//     largest built; a 128 x 128 tile of double would spill, see filter.cu).
//     Default 4: a 4 x 4 micro-tile, 16 accumulators, vector loads on both operands.
#ifndef RM
#define RM 4
#endif
// RN: columns of outputs per thread.  The wrapper uses 4 with the small tiles and
//     TN/16 (4, 6 or 8) with the 128-row tiles, so those have 16 threads across.
//     Must divide TN.  Default 4, as RM.
#ifndef RN
#define RN 4
#endif
// GT_STAGES: K chunks held in shared memory (above, "Loading").  1 (default): loads
//     through registers, two barriers a chunk (the kernels measured on the H100).  2 to
//     4: the cp.async pipeline; each stage costs TK*(GT_PAD(TM) + GT_PAD(TN))*sizeof(T)
//     of the 48 KiB of static shared memory (checked in gemm_tile), so the 128 x 64 and
//     128 x 96 tiles take 2 or 3 stages at TK = 16, the 128 x 128 tile 2, and 3 or 4
//     stages take TK = 8 where 16 does not fit.  The wrapper passes it with a
//     variant (VARIANTS in cotsdl/ops/cuda/filter.py); more stages hide more load latency
//     and cost shared memory (fewer resident blocks).
#ifndef GT_STAGES
#define GT_STAGES 1
#endif
#if GT_STAGES < 1 || GT_STAGES > 4
#error "gemm_tile.cuh: GT_STAGES must be 1 (register loads) or 2 to 4 (cp.async pipeline stages)"
#endif
#if TM <= 0 || TN <= 0 || TK <= 0 || RM <= 0 || RN <= 0
#error "gemm_tile.cuh: TM, TN, TK, RM and RN must be positive"
#endif
#if TM % RM != 0 || TN % RN != 0
#error "gemm_tile.cuh: TM must be a multiple of RM and TN a multiple of RN (the (TN/RN) x (TM/RM) threads, RM x RN outputs each, must cover the TM x TN tile exactly)"
#endif
// GT_THREADS: threads per block, (TM/RM)*(TN/RN).  The launch must use exactly the
//     block (TN/RN, TM/RM) (the wrapper does): the chunk loads stride by GT_THREADS and
//     filter.cu declares __launch_bounds__(GT_THREADS, 1).  At most 1024, the CUDA
//     limit (checked below).  The built variants use 32 to 256, all whole warps
//     (a multiple of 32 is not needed for correctness, only to leave no lane idle).
#define GT_THREADS ((TM / RM) * (TN / RN))
#if GT_THREADS > 1024
#error "gemm_tile.cuh: (TM/RM)*(TN/RN) threads per block exceeds the CUDA limit of 1024: raise RM or RN, or lower TM or TN"
#endif
// GT_PAD(X): length in elements of a shared row holding X values, X + 4.  Padding by 4
//     keeps each row start 16-byte aligned for the float4 reads (X is a multiple of 4
//     whenever the vector path is taken, since RM | TM and RN | TN), and keeps a row
//     from being a multiple of 32 words (the bank count) long, so the k-fast stores of
//     a chunk (consecutive threads, consecutive rows, same column) do not all fall in
//     one bank.
#define GT_PAD(X) ((X) + 4)

template <typename T, int R>
__device__ __forceinline__ void gt_read(const T* p, T (&v)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) v[i] = p[i];
}

// float rows of a multiple of 4: 128-bit shared loads.  p is 16-byte aligned: the row
// starts are (GT_PAD) and the offset ty*RM or tx*RN is then a multiple of 4.
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

// One element global -> shared without passing through registers (cp.async.ca, 4 or 8
// bytes), and its group commit and wait; see "Loading" above for the other builds.
template <typename T>
__device__ __forceinline__ void gt_copy_async(T* dst, const T* src) {
#if defined(COTSDL_CUDAEMU)
    cotsdl_emu::cp_async(dst, src, sizeof(T));
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "gemm_tile.cuh: cp.async copies 4 or 8 bytes here");
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(d), "l"(src), "n"(sizeof(T)) : "memory");
#else
    *dst = *src;
#endif
}

__device__ __forceinline__ void gt_commit() {
#if defined(COTSDL_CUDAEMU)
    cotsdl_emu::cp_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Wait until at most PENDING of this thread's committed groups are still in flight.
template <int PENDING>
__device__ __forceinline__ void gt_wait() {
#if defined(COTSDL_CUDAEMU)
    cotsdl_emu::cp_wait(PENDING);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
#endif
}

template <typename T>
__device__ __forceinline__ void gt_mma_chunk(const T (*As)[GT_PAD(TM)], const T (*Bs)[GT_PAD(TN)], T (&acc)[RM][RN]) {
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
}

// Chunk k0 of A and B into As / Bs: one element a thread at a time, the fast global index
// fastest across threads; an element outside the matrix, or whose map gives nullptr, is 0.
// ASYNC: through gt_copy_async (the caller commits and waits), else loaded and stored.
template <typename T, bool A_K_FAST, bool B_N_FAST, bool ASYNC, class LA, class LB>
__device__ __forceinline__ void gt_load_chunk(int M, int N, int K, int m0, int n0, int k0, int tid, LA a, LB b,
                                              T (*As)[GT_PAD(TM)], T (*Bs)[GT_PAD(TN)]) {
    for (int e = tid; e < TM * TK; e += GT_THREADS) {
        int mm, kk;
        if (A_K_FAST) { kk = e % TK; mm = e / TK; } else { mm = e % TM; kk = e / TM; }
        const int m = m0 + mm, k = k0 + kk;
        const T* p = (m < M && k < K) ? a(m, k) : nullptr;
        if (ASYNC && p) gt_copy_async(&As[kk][mm], p);
        else As[kk][mm] = p ? *p : T(0);
    }
    for (int e = tid; e < TK * TN; e += GT_THREADS) {
        int kk, nn;
        if (B_N_FAST) { nn = e % TN; kk = e / TN; } else { kk = e % TK; nn = e / TK; }
        const int k = k0 + kk, n = n0 + nn;
        const T* p = (k < K && n < N) ? b(k, n) : nullptr;
        if (ASYNC && p) gt_copy_async(&Bs[kk][nn], p);
        else Bs[kk][nn] = p ? *p : T(0);
    }
}

template <typename T, bool A_K_FAST, bool B_N_FAST, class LA, class LB, class ST>
__device__ __forceinline__ void gemm_tile(int M, int N, int K, int m0, int n0, LA a, LB b, ST store) {
    static_assert(sizeof(T) * GT_STAGES * TK * (GT_PAD(TM) + GT_PAD(TN)) <= 48 * 1024,
                  "gemm_tile.cuh: the GT_STAGES chunks of As + Bs exceed the 48 KiB of static shared memory a "
                  "block may have: lower GT_STAGES, TK, TM or TN");
    __shared__ __align__(16) T As[GT_STAGES][TK][GT_PAD(TM)];
    __shared__ __align__(16) T Bs[GT_STAGES][TK][GT_PAD(TN)];
    const int tid = threadIdx.y * (TN / RN) + threadIdx.x;
    T acc[RM][RN];
#pragma unroll
    for (int i = 0; i < RM; ++i)
#pragma unroll
        for (int j = 0; j < RN; ++j) acc[i][j] = T(0);
#if GT_STAGES == 1
    for (int k0 = 0; k0 < K; k0 += TK) {
        gt_load_chunk<T, A_K_FAST, B_N_FAST, false>(M, N, K, m0, n0, k0, tid, a, b, As[0], Bs[0]);
        __syncthreads();
        gt_mma_chunk<T>(As[0], Bs[0], acc);
        __syncthreads();
    }
#else
    // Chunk c lives in stage c % GT_STAGES.  Before multiplying chunk c a thread waits for
    // its own copies of it (groups are committed one per chunk, empty ones too, so "at
    // most GT_STAGES - 2 pending" means chunks 0..c have landed), and the barrier makes
    // every thread's copies visible and says that all have finished chunk c - 1, whose
    // stage then receives chunk c + GT_STAGES - 1.
    const int chunks = (K + TK - 1) / TK;
#pragma unroll
    for (int c = 0; c < GT_STAGES - 1; ++c) {
        if (c < chunks)
            gt_load_chunk<T, A_K_FAST, B_N_FAST, true>(M, N, K, m0, n0, c * TK, tid, a, b, As[c], Bs[c]);
        gt_commit();
    }
    for (int c = 0; c < chunks; ++c) {
        gt_wait<GT_STAGES - 2>();
        __syncthreads();
        const int next = c + GT_STAGES - 1;
        if (next < chunks)
            gt_load_chunk<T, A_K_FAST, B_N_FAST, true>(M, N, K, m0, n0, next * TK, tid, a, b, As[next % GT_STAGES],
                                                       Bs[next % GT_STAGES]);
        gt_commit();
        gt_mma_chunk<T>(As[c % GT_STAGES], Bs[c % GT_STAGES], acc);
    }
#endif
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
