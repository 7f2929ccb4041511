// Halo pack/unpack kernels of the distributed-array exchange (cotsdl/array/exchange.py).
//
// Layout.  The local array is a window of an (H, W, C, N) float32 or float64 tensor,
// C-contiguous with N fastest, addressed as  src[base + i*sH + j*sW + c*sC + n]
// (element strides; sN == 1).  A box of extent (bh, bw, bc, bn) starting at local
// offset `base` is packed into a contiguous message buffer in the same row-major order:
//     buf[((i*bw + j)*bc + c)*bn + n].
// Threads.  A 1-D grid of 1-D blocks; one thread per element of the box, a grid-stride
// loop over the linear index e = ((i*bw + j)*bc + c)*bn + n; consecutive threads take
// consecutive n, so both the strided side and the packed side are coalesced along N.
// Any grid and block size is correct; the caller (cotsdl/array/boxcopy.py) launches
// 256 threads a block and at most 4096 blocks.  Extents are int, the linear index and
// offsets long long, so a box may hold more than 2^31 elements.
//
// Callers.  The exchange packs and unpacks the boxes of its packed, staged and
// cuda-aware transports through pack/unpack of cotsdl/array/boxcopy.py, which run these
// kernels for CuPy arrays (on the GPU) and under COTSDL_BACKEND=cuda-emu (on the CPU
// emulator) when the array is 4-D, C-contiguous, float32 or float64; other arrays are
// copied by slicing.  The adjoint exchange unpacks with accumulate = 1.
//
// Compile-time parameters: none (no #define is read from the preamble).
// COTSDL_HALO_INSTANCES(T, SUFFIX) defines the extern "C" kernels pack_box_SUFFIX and
// unpack_box_SUFFIX for element type T (f32: float, f64: double).

template <typename T>
__device__ __forceinline__ long long box_offset(long long e, int bw, int bc, int bn,
                                                long long sH, long long sW, long long sC) {
    const long long n = e % bn;
    long long r = e / bn;
    const long long c = r % bc;
    r /= bc;
    const long long j = r % bw;
    const long long i = r / bw;
    return i * sH + j * sW + c * sC + n;
}

template <typename T>
__device__ void pack_box(const T* __restrict__ src, T* __restrict__ buf, long long base,
                         long long sH, long long sW, long long sC,
                         int bh, int bw, int bc, int bn) {
    const long long total = (long long)bh * bw * bc * bn;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        buf[e] = src[base + box_offset<T>(e, bw, bc, bn, sH, sW, sC)];
    }
}

// accumulate != 0 adds the message into the box (the adjoint exchange); else overwrites.
template <typename T>
__device__ void unpack_box(const T* __restrict__ buf, T* __restrict__ dst, long long base,
                           long long sH, long long sW, long long sC,
                           int bh, int bw, int bc, int bn, int accumulate) {
    const long long total = (long long)bh * bw * bc * bn;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long o = base + box_offset<T>(e, bw, bc, bn, sH, sW, sC);
        dst[o] = accumulate ? dst[o] + buf[e] : buf[e];
    }
}

#define COTSDL_HALO_INSTANCES(T, SUFFIX)                                                        \
    extern "C" __global__ void pack_box_##SUFFIX(const T* __restrict__ src, T* __restrict__ buf, \
            long long base, long long sH, long long sW, long long sC,                           \
            int bh, int bw, int bc, int bn) {                                                    \
        pack_box<T>(src, buf, base, sH, sW, sC, bh, bw, bc, bn);                                 \
    }                                                                                            \
    extern "C" __global__ void unpack_box_##SUFFIX(const T* __restrict__ buf, T* __restrict__ dst,\
            long long base, long long sH, long long sW, long long sC,                           \
            int bh, int bw, int bc, int bn, int accumulate) {                                    \
        unpack_box<T>(buf, dst, base, sH, sW, sC, bh, bw, bc, bn, accumulate);                   \
    }

COTSDL_HALO_INSTANCES(float, f32)
COTSDL_HALO_INSTANCES(double, f64)
