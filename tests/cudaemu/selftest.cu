// Emulator self-test kernels, written in ordinary CUDA style.

#define TILE 16

// C (n x m) = A (n x k) B (k x m), row-major; one TILE x TILE block per output tile.
// threadIdx.x covers columns, threadIdx.y rows; sizes need not be multiples of TILE.
extern "C" __global__ void matmul_tiled(const float* __restrict__ A, const float* __restrict__ B,
                                        float* __restrict__ C, int n, int k, int m) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE + 1];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.f;
    for (int t = 0; t < k; t += TILE) {
        As[threadIdx.y][threadIdx.x] = (row < n && t + threadIdx.x < k) ? A[row * k + t + threadIdx.x] : 0.f;
        Bs[threadIdx.y][threadIdx.x] = (col < m && t + threadIdx.y < k) ? B[(t + threadIdx.y) * m + col] : 0.f;
        __syncthreads();
        for (int i = 0; i < TILE; ++i) acc += As[threadIdx.y][i] * Bs[i][threadIdx.x];
        __syncthreads();
    }
    if (row < n && col < m) C[row * m + col] = acc;
}

// Per-block sum of x: shared-memory tree down to one warp, then warp shuffles.
// Works for any blockDim.x <= 1024 (a partial last warp included).
extern "C" __global__ void block_sum(const float* __restrict__ x, float* __restrict__ out, int n) {
    __shared__ float warp_sums[32];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.f;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    // A partial last warp has fewer lanes: shuffle among the present ones only.
    unsigned active = __activemask();
    int width = __popc(active);
    for (int d = 16; d > 0; d >>= 1) {
        float u = __shfl_down_sync(active, v, d);
        if (lane + d < width) v += u;
    }
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    int nwarps = (blockDim.x + 31) / 32;
    if (warp == 0) {
        v = lane < nwarps ? warp_sums[lane] : 0.f;
        for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
        if (lane == 0) out[blockIdx.x] = v;
    }
}

// Histogram of bytes: shared atomics per block, then global atomics.
extern "C" __global__ void histogram(const unsigned char* __restrict__ data, int n, unsigned int* __restrict__ hist) {
    __shared__ unsigned int local[256];
    for (int b = threadIdx.x; b < 256; b += blockDim.x) local[b] = 0;
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        atomicAdd(&local[data[i]], 1u);
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += blockDim.x) atomicAdd(&hist[b], local[b]);
}

// Reverse each block's chunk through dynamic shared memory (blockDim.x floats).
extern "C" __global__ void reverse_chunks(const float* __restrict__ x, float* __restrict__ y, int n) {
    extern __shared__ float buf[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    buf[threadIdx.x] = i < n ? x[i] : 0.f;
    __syncthreads();
    int j = blockIdx.x * blockDim.x + (blockDim.x - 1 - threadIdx.x);
    if (i < n && j < n) y[i] = buf[blockDim.x - 1 - threadIdx.x];
    else if (i < n) y[i] = -1.f;
}

// Inclusive warp scan with __shfl_up_sync, a ballot and __syncthreads_count.
extern "C" __global__ void warp_scan(const int* __restrict__ x, int* __restrict__ scan, unsigned* __restrict__ ballots,
                                     int* __restrict__ positives) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = x[i];
    for (int d = 1; d < 32; d <<= 1) {
        int u = __shfl_up_sync(0xffffffffu, v, d);
        if ((int)(threadIdx.x % 32) >= d) v += u;
    }
    scan[i] = v;
    unsigned b = __ballot_sync(0xffffffffu, x[i] > 0);
    if (threadIdx.x % 32 == 0) ballots[i / 32] = b;
    int c = __syncthreads_count(x[i] > 0);
    if (threadIdx.x == 0) positives[blockIdx.x] = c;
}

// BUG on purpose: neighbours are read without a barrier after the write.
extern "C" __global__ void missing_sync(const float* __restrict__ x, float* __restrict__ y) {
    __shared__ float s[256];
    s[threadIdx.x] = x[threadIdx.x] * 2.f;
    // __syncthreads() missing here
    y[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
    __syncthreads();
}

// BUG on purpose: thread 5 of block 1 writes one element past the end.
extern "C" __global__ void out_of_bounds(float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 1.f;
    if (blockIdx.x == 1 && threadIdx.x == 5) y[n] = 2.f;
}

// BUG on purpose: reads dynamic shared memory past the requested size.
extern "C" __global__ void shared_out_of_bounds(float* __restrict__ y) {
    extern __shared__ float buf[];
    buf[threadIdx.x] = 1.f;
    __syncthreads();
    y[threadIdx.x] = buf[threadIdx.x + blockDim.x];
}

// BUG on purpose: half a warp waits at a shuffle, the other half at a block barrier.
extern "C" __global__ void deadlock(float* __restrict__ y) {
    float v = 1.f;
    if (threadIdx.x < 16) v = __shfl_sync(0xffffffffu, v, 0);
    else __syncthreads();
    y[threadIdx.x] = v;
}
